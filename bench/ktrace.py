#!/usr/bin/env python3
"""ktrace.py -- sum the decode steps of a bench/ktrace.c timeline.

Usage: ktrace.py TRACE.csv [--steps S] [--skip K] [--walls] [--seq N] [--host]
A decode step starts at an embedding kernel (one a step); the last S steps of the file are taken
(K of them dropped from the front: the first steps record graphs). For each kernel (its
unmangled base name), per step: launches, device time, and the idle time of the device just
before it (the gap from the previous record's end), then the step's wall time (embed to embed),
its busy time and its idle time. --walls: also every step's wall time (embed to embed) in the
file's order; --seq N: also the first N records of the last whole step, each with its duration
and the idle gap before it; --host: also the host's CUDA runtime calls (R records) that began
inside the steps taken, per step: calls and host time by name (a call that waits for the device,
such as a stream synchronisation, shows its wait here). Only the standard library."""
import re
import sys


def base_name(n):
    m = re.match(r"_Z(\d+)(.*)", n)
    if m:
        return m.group(2)[: int(m.group(1))]
    return n.split("(")[0].split("<")[0]


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    path, steps, skip = args[0], 8, 1
    if "--steps" in args:
        steps = int(args[args.index("--steps") + 1])
    if "--skip" in args:
        skip = int(args[args.index("--skip") + 1])
    rec, host = [], []
    with open(path) as f:
        for line in f:
            p = line.rstrip("\n").split(",", 5)
            if len(p) == 6:
                (host if p[0] == "R" else rec).append((int(p[1]), int(p[2]), p[0], base_name(p[5])))
    rec.sort()
    emb = [i for i, r in enumerate(rec) if "embed" in r[3]]
    if len(emb) < steps + 1:
        sys.exit("ktrace.py: %d embedding launches, fewer than --steps %d + 1" % (len(emb), steps))
    starts = emb[-(steps + 1):]
    use = list(range(skip, steps))  # step j spans rec[starts[j]:starts[j+1]]
    tab = {}
    wall = busy = idle = 0
    for j in use:
        a, b = starts[j], starts[j + 1]
        wall += rec[b][0] - rec[a][0]
        for i in range(a, b):
            s, e, _, n = rec[i]
            g = max(0, s - rec[i - 1][1]) if i > 0 else 0
            t = tab.setdefault(n, [0, 0, 0])
            t[0] += 1
            t[1] += e - s
            t[2] += g
            busy += e - s
            idle += g
    if "--walls" in args:
        walls = [(rec[emb[i + 1]][0] - rec[emb[i]][0]) / 1e3 for i in range(len(emb) - 1)]
        print("step walls (us): " + " ".join("%.0f" % w for w in walls))
    if "--seq" in args:
        a, b = starts[-2], starts[-1]
        for i in range(a, min(b, a + int(args[args.index("--seq") + 1]))):
            s, e, _, n = rec[i]
            print("%-28s dur %8.1f gap %7.1f" % (n[:28], (e - s) / 1e3, (s - rec[i - 1][1]) / 1e3))
    ns = len(use)
    if "--host" in args:
        htab = {}
        for j in use:
            t0, t1 = rec[starts[j]][0], rec[starts[j + 1]][0]
            for s, e, _, n in host:
                if t0 <= s < t1:
                    t = htab.setdefault(n, [0, 0])
                    t[0] += 1
                    t[1] += e - s
        print("%-40s %8s %10s" % ("host runtime call", "calls", "host_us"))
        for n, t in sorted(htab.items(), key=lambda kv: -kv[1][1]):
            print("%-40s %8.1f %10.1f" % (n[:40], t[0] / ns, t[1] / ns / 1e3))
    print("%d decode steps: wall %.1f us a step, kernels %.1f us, idle before launches %.1f us" %
          (ns, wall / ns / 1e3, busy / ns / 1e3, idle / ns / 1e3))
    print("%-40s %8s %10s %10s" % ("kernel", "calls", "device_us", "idle_us"))
    for n, t in sorted(tab.items(), key=lambda kv: -(kv[1][1] + kv[1][2])):
        print("%-40s %8.1f %10.1f %10.1f" % (n[:40], t[0] / ns, t[1] / ns / 1e3, t[2] / ns / 1e3))


if __name__ == "__main__":
    main()
