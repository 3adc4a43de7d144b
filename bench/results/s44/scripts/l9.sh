#!/bin/bash
# l9: new = H (on T = 5b03dac: the query's pairs loaded into registers before anything is copied, and the first
# tiles' table rows issued before their K and V in every list call, held steps too: scripts/l9-held-order.diff);
# t = T. GPU tests of new; bench_kernels --list of t, new and hph (H with scripts/l2-phases.diff), two rounds; then
# two rounds a build: the hit path at 128K and TokenSelect at 32K, with full (bench's step_ms, TPOT).
. bench/gpu_pack_env.sh
{ tst test_attn_list; tst test_cuda --quick; tst test_cuda_policies; } > $O/tests.txt 2>&1
cat $O/tests.txt
for r in 1 2; do for v in t new hph; do echo "== $v round $r"; $R/$v/bench_kernels --list 2>&1 | grep -v "^summary\|ceiling\|cuBLAS\|^device\|^kernel"; done; done > $O/list.txt 2>&1
grep -E "^==|graph" $O/list.txt | grep -v PDL
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for r in 1 2; do for v in t new; do
  echo "== $v hit128 round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 131040 --gen 16 --policy none,tokenselect --set tokenselect.cache_theta=-1 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  echo "== $v 32K round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 32768 --gen 32 --policy none,tokenselect 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/rows.txt 2>&1
cat $O/rows.txt
