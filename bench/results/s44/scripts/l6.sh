#!/bin/bash
# l6: new = T (behind a decode handler's last kernel, each list warp checks the rope table's header itself and
# issues its first tiles' table rows before it waits; elsewhere the order is base's: scripts/l6-table-behind.diff);
# base = main (0b84645). GPU tests of new, then two rounds a build: full and TokenSelect at 32K; full, TokenSelect
# and Quest at 128K; full and the hit path at 128K (bench's step_ms, TPOT).
. bench/gpu_pack_env.sh
{ tst test_attn_list; tst test_cuda --quick; tst test_cuda_policies; } > $O/tests.txt 2>&1
cat $O/tests.txt
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for r in 1 2; do for v in base new; do
  echo "== $v 32K round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 32768 --gen 32 --policy none,tokenselect 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  echo "== $v 128K round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 131040 --gen 16 --policy none,tokenselect,quest --set quest.budget=4096 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  echo "== $v hit128 round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 131040 --gen 16 --policy none,tokenselect --set tokenselect.cache_theta=-1 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/rows.txt 2>&1
cat $O/rows.txt
