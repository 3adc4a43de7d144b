# sp.py STAMPS.txt.xz [--prologue]: the scores kernel's phase stamps (sc1phases.diff; with --prologue q1ph2.diff's
# finer prologue stamps) summarised per call (session 34, x5, x6, x7)
import sys, collections, statistics as st
calls = collections.defaultdict(list)
import lzma
for line in lzma.open(sys.argv[1], 'rt'):
    if not line.startswith('SP '): continue
    f = line.split()
    c = int(f[1]); t0 = int(f[5]); offs = [int(x) for x in f[6:14]]
    calls[c].append([t0] + [t0 + o for o in offs])
names = ['start', 'prologue', 'loop', 'partial', 'bar1', 'combine', 'groupsums', 'bar2', 'end']
if '--prologue' in sys.argv:
    names = ['start', 'qissued', 'k0issued', 'rotated', 'syncA', 'frags', 'syncB', 'loop', 'end']
rows = []
for c, bl in sorted(calls.items()):
    s0 = min(b[0] for b in bl)
    rows.append([[(b[i] - s0) / 1e3 for b in bl] for i in range(9)])
print("blocks a call:", len(next(iter(calls.values()))), "calls:", len(calls))
print("%-10s %8s %8s %8s   (us from the call's first block start; medians over calls of min / median / max over blocks)" % ("phase", "min", "med", "max"))
for i, n in enumerate(names):
    mn = st.median(min(r[i]) for r in rows); md = st.median(st.median(r[i]) for r in rows); mx = st.median(max(r[i]) for r in rows)
    print("%-10s %8.2f %8.2f %8.2f" % (n, mn, md, mx))
