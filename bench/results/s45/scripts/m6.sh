#!/bin/bash
# m6: an upper bound, not a candidate build: how much of TokenSelect's top-k is its first radix pass? h1 = base with
# scripts/m6-h1-first-digit-given.diff: a kernel outside the timed graph writes the vote row's first-digit histogram
# into a device array, and tk_clu takes its first digit from it instead of counting and exchanging it (no cluster
# barrier, no remote adds in that pass). bench_kernels --select, two rounds; h1 prints both the plain top-k and the
# one with the first digit given, in one process, and whether their indices are the same.
. bench/gpu_pack_env.sh
for r in 1 2; do for v in base h1; do echo "== $v round $r"; $R/$v/bench_kernels --select 2>&1 | grep -E 'topk|first digit'; done; done > $O/select.txt 2>&1
cat $O/select.txt
