#!/bin/bash
# m7: an upper bound, not a candidate build: what the combine costs the held step's list attention. nc = main
# (51a8dc5) with scripts/m7-nc-no-combine.diff: bench_kernels --list gets a fifth row, "random x8, no combine", the
# same calls without the combine kernel (its output unused). Two rounds, one process each.
. bench/gpu_pack_env.sh
for r in 1 2; do echo "== nc round $r"; $R/nc/bench_kernels --list 2>&1 | grep 'graph (a call)'; done > $O/list.txt 2>&1
cat $O/list.txt
