#!/bin/bash
# m2: new = A2 (A with only the first two query pairs a thread held in registers, the rest loaded in the staging
# loop as before, so each instance stays within a few registers of base: scripts/m2-a2.diff); base = 839b1b1.
# GPU tests of new; bench_kernels --list of base and new, two rounds; then two rounds a build: the hit path at 128K
# and 32K, TokenSelect's default at 32K and 128K, with full (step_ms, TPOT).
. bench/gpu_pack_env.sh
{ tst test_attn_list; tst test_cuda --quick; tst test_cuda_policies; } > $O/tests.txt 2>&1
cat $O/tests.txt
for r in 1 2; do for v in base new; do echo "== $v round $r"; $R/$v/bench_kernels --list 2>&1 | grep -v "^summary\|ceiling\|cuBLAS\|^device\|^kernel"; done; done > $O/list.txt 2>&1
grep -E "^==|graph" $O/list.txt | grep -v PDL
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for r in 1 2; do for v in base new; do
  echo "== $v hit128 round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 131040 --gen 16 --policy none,tokenselect --set tokenselect.cache_theta=-1 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  echo "== $v 128K default round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 131040 --gen 16 --policy none,tokenselect 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  echo "== $v hit32 round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 32768 --gen 32 --policy none,tokenselect --set tokenselect.cache_theta=-1 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  echo "== $v 32K default round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 32768 --gen 32 --policy none,tokenselect 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/rows.txt 2>&1
cat $O/rows.txt
