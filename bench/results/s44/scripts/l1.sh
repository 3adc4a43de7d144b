#!/bin/bash
# l1: the held step's list attention (bench_kernels --list): random, consecutive and L2-resident rows, two rounds.
source bench/gpu_pack_env.sh
for r in 1 2; do $R/base/bench_kernels --list 2>&1 | grep -v "^summary" > $O/list-$r.txt; done
cat $O/card.txt $O/list-*.txt
