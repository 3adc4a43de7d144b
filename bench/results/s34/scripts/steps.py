# steps.py TRACE.csv N: the last N decode steps of a bench/ktrace.c timeline, each with its wall, device busy time,
# its four costliest host runtime calls (calls/us) and its kernel count (session 34, x3)
import sys, re
sys.path.insert(0, 'bench')  # run from the repository root
from ktrace import base_name
path, nsteps = sys.argv[1], int(sys.argv[2])
rec, host = [], []
for line in open(path):
    p = line.rstrip("\n").split(",", 5)
    if len(p) == 6:
        (host if p[0] == "R" else rec).append((int(p[1]), int(p[2]), p[0], base_name(p[5])))
rec.sort(); host.sort()
emb = [i for i, r in enumerate(rec) if "embed" in r[3]]
starts = emb[-(nsteps + 1):]
for j in range(nsteps):
    a, b = rec[starts[j]][0], rec[starts[j + 1]][0]
    busy = sum(e - s for s, e, _, n in rec[starts[j]:starts[j+1]])
    hs = {}
    for s, e, _, n in host:
        if a <= s < b:
            t = hs.setdefault(n, [0, 0]); t[0] += 1; t[1] += e - s
    top = sorted(hs.items(), key=lambda kv: -kv[1][1])[:4]
    kn = {}
    for s, e, _, n in rec[starts[j]:starts[j+1]]:
        kn[n] = kn.get(n, 0) + 1
    print("step %2d wall %6.0f busy %6.0f  " % (j + 1, (b - a) / 1e3, busy / 1e3) + "  ".join("%s %d/%.0f" % (n[:22], c, t / 1e3) for n, (c, t) in top) + "  | nk=%d" % sum(kn.values()))
