#!/bin/bash
# l4: new = V3 (V1, the query rotated from the rope table; V2, its loads in one batch; V3, every warp checks the
# table header itself and issues its first tiles' table rows with their K and V copies: scripts/l4-v3.diff); base = main
# (0b84645). GPU tests of new; bench_kernels --list of base, new and the
# stamped builds (ph = base with scripts/l2-phases.diff, v2ph = V2 with it, v3ph = V3 with it), two rounds.
source bench/gpu_pack_env.sh
{ tst test_attn_list; tst test_cuda --quick; tst test_cuda_policies; } > $O/tests.txt 2>&1
cat $O/tests.txt
for r in 1 2; do for v in base new v2ph v3ph ph; do echo "== $v round $r"; $R/$v/bench_kernels --list 2>&1 | grep -v "^summary\|ceiling\|cuBLAS\|^device\|^kernel"; done; done > $O/list.txt 2>&1
grep -E "^==|graph" $O/list.txt
