#!/bin/bash
# l3: new = V1 (the list attention's query rotated from the rope table where the table holds its rope and position;
# scripts/l3-v1-query-table.diff); base = main (0b84645). GPU tests of new; bench_kernels --list of base, new, and the
# stamped builds (ph = base with scripts/l2-phases.diff, v1ph = new with it), two rounds.
source bench/gpu_pack_env.sh
{ tst test_attn_list; tst test_cuda --quick; tst test_cuda_policies; } > $O/tests.txt 2>&1
cat $O/tests.txt
for r in 1 2; do for v in base new v1ph ph; do echo "== $v round $r"; $R/$v/bench_kernels --list 2>&1 | grep -v "^summary\|ceiling\|cuBLAS\|^device\|^kernel"; done; done > $O/list.txt 2>&1
grep -E "^==|graph" $O/list.txt
