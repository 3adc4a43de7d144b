#!/usr/bin/env python3
"""ph2.py -- reads the PH lines of a2-phases.diff's build (the list attention's stamps: block start, after the
prologue and wait, tile 0 landed, loop end, end; thread 0 of each block, list calls 8-21 at layers 4-7). For each
call printed: its phases in us from its first block's start, the median over blocks [min, max], apart for the blocks
that wait and those that do not. Usage: ph2.py FILE."""
import sys, statistics as st
rec = {}
for line in open(sys.argv[1]):
    if not line.startswith("PH at "): continue
    p = line.split()
    c = int(p[2]); rec.setdefault(c, []).append([int(x) for x in p[3:]])
def col(rows, i, t0, sel):
    v = [(r[i] - t0) / 1000 for r in rows if sel(r)]
    return "%7.2f [%7.2f %7.2f]" % (st.median(v), min(v), max(v)) if v else "-"
for c in sorted(rec):
    a = rec[c]; t0 = min(r[3] for r in a)
    print("== list call %d: %d blocks (%d wait)" % (c, len(a), sum(r[2] for r in a)))
    for w, wn in ((1, "waits"), (0, "ranges")):
        for i, n in enumerate(["start", "after wait", "tile 0 landed", "loop end", "end"]):
            print("  %-6s %-14s %s" % (wn, n, col(a, 3 + i, t0, lambda r: r[2] == w)))
