# session 39, c8: base beside new (the list attention's K and V row copies with an L2 evict-first policy, so that the
# o-projection prefetched behind them stays in L2: scripts/c8-list-evict-first.diff). GPU tests of new
# (test_attn_list, test_cuda_policies), ncu of the o- and down projections' gemv in TokenSelect's 32K step (DRAM
# bytes, as c6), TPOT rounds beside full attention: two at 32K, one at 128K.
. bench/gpu_pack_env.sh
{ tst test_attn_list; tst test_cuda_policies; } > $O/tests.txt 2>&1; cat $O/tests.txt
echo "== new tokenselect" > $O/ncu.txt
KVSIEVE_POLICY_PATH=$R/new/policies timeout 200 ncu --clock-control none --cache-control none -k regex:gemv_kernel \
  --launch-skip 390 --launch-count 4 --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \
  $R/new/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 --lengths 32768 \
  --policy tokenselect --gen 10 2>&1 | grep -E "gemv_kernel|gpu__time|dram__bytes|grid_size|ERR" | head -16 >> $O/ncu.txt 2>&1
cat $O/ncu.txt
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for r in 1 2; do for v in base new; do echo "== $v 32K round $r"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 32768 --policy none,tokenselect --gen 32 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/r32.txt 2>&1
cat $O/r32.txt
for v in base new; do echo "== $v 128K round 1"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 131040 --policy none,tokenselect --gen 16 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done > $O/r128.txt 2>&1
cat $O/r128.txt
