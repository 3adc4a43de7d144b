#!/usr/bin/env python3
"""ph.py -- reads c2's stamps (PH lines of scripts/c2-phases.diff's build). For each recorded scores call printed
(layers 4-7 of the 12th step after the recording), the top-k after it and the list attention after that (matched by
start time), their phases in us from the scores kernel's first block start: the median over blocks [min, max].
Usage: ph.py FILE."""
import sys, statistics as st
rec = {}
for line in open(sys.argv[1]):
    if not line.startswith("PH "): continue
    p = line.split()
    k, c = p[1], int(p[2])
    rec.setdefault(k, {}).setdefault(c, []).append([int(x) for x in p[3:]])
def first(rows, i):
    return min(r[i] for r in rows)
def col(rows, i, t0, sel=None):
    v = [(r[i] - t0) / 1000 for r in rows if (sel is None or sel(r)) and r[i] > 0]
    return "%7.2f [%7.2f %7.2f]" % (st.median(v), min(v), max(v)) if v else "-"
def after(kind, t, col0):
    best = None
    for c, rows in rec.get(kind, {}).items():
        s = first(rows, col0)
        if s >= t and (best is None or s < first(best, col0)): best = rows
    return best
for c in sorted(rec["sc1"]):
    s = rec["sc1"][c]
    t0 = first(s, 2)
    t = after("tk", t0, 2) or []
    a = after("at", t0, 3) or []
    print("== scores call %d: %d scores blocks, %d top-k blocks, %d list blocks (%d wait for the top-k)" % (c, len(s), len(t), len(a), sum(r[2] for r in a)))
    for i, n in enumerate(["start", "prologue", "loop end", "barrier 1", "group sums", "barrier 2", "end"]):
        print("  sc1 %-19s %s" % (n, col(s, 2 + i, t0)))
    for i, n in enumerate(["start", "keys read", "pass 1", "pass 2", "pass 3", "pass 4", "compaction", "end"]):
        print("  tk  %-19s %s" % (n, col(t, 2 + i, t0)))
    for w, wn in ((1, "waits"), (0, "ranges")):
        for i, n in enumerate(["start", "after wait", "tile 0 landed", "loop end", "end"]):
            print("  at  %-6s %-12s %s" % (wn, n, col(a, 3 + i, t0, lambda r: r[2] == w)))
