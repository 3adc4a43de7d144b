# session 39, c5: base beside new (the scores kernel's first tile loads issued once the thread's query came back, after
# its rotation; scripts/c5-qA.diff) and nB (issued once the block's query fragments are cut; scripts/c5-qB.diff). GPU tests
# of new (test_cuda_prims --only scores, --only grow), timelines of TokenSelect at 32K and 128K, TPOT rounds beside full
# attention: two at 32K, one at 128K.
. bench/gpu_pack_env.sh
{ tst test_cuda_prims --only scores; tst test_cuda_prims --only grow; } > $O/tests.txt 2>&1; cat $O/tests.txt
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for L in 32768 131040; do for v in base new nB; do
  echo "== $v tokenselect $L timeline"
  KVSIEVE_POLICY_PATH=$R/$v/policies CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $R/$v/kvsieve $B --lengths $L --policy tokenselect --gen 12 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:' | head -4
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -9; rm -f $R/t.csv
done; done > $O/trace.txt 2>&1
cat $O/trace.txt
for r in 1 2; do for v in base new nB; do echo "== $v 32K round $r"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 32768 --policy none,tokenselect --gen 32 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/r32.txt 2>&1
cat $O/r32.txt
for v in base new nB; do echo "== $v 128K round 1"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 131040 --policy none,tokenselect --gen 16 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done > $O/r128.txt 2>&1
cat $O/r128.txt
