#!/bin/bash
# l2: the held step's list attention with %globaltimer stamps (scripts/l2-phases.diff, bench_kernels --list built with -DKS_PH).
source bench/gpu_pack_env.sh
for r in 1 2; do $R/ph/bench_kernels --list 2>&1 | grep -v "^summary" > $O/list-ph-$r.txt; done
cat $O/list-ph-*.txt
