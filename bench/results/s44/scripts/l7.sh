#!/bin/bash
# l7: new = K (a growing row's top-k loads its votes before the step slot's delta and the mask arrive, its slices
# over the most keys the recording allows: scripts/l7-topk-loads.diff) on T (5b03dac); t = T. GPU tests of new
# (test_cuda_prims: grow, topk; test_cuda_policies), then two rounds a build: full and TokenSelect at 32K and at 128K (bench's step_ms, TPOT).
. bench/gpu_pack_env.sh
{ tst test_cuda_prims --only grow; tst test_cuda_prims --only topk; tst test_cuda_policies; } > $O/tests.txt 2>&1
cat $O/tests.txt
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for r in 1 2; do for v in t new; do
  echo "== $v 32K round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 32768 --gen 32 --policy none,tokenselect 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  echo "== $v 128K round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 131040 --gen 16 --policy none,tokenselect 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/rows.txt 2>&1
cat $O/rows.txt
