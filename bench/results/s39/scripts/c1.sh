# session 39, c1: base (main before the session) beside new (the scores kernel's first loop steps staged in shared
# memory by bulk copies at each block's start). GPU tests of new (test_cuda_prims --only scores, --only grow, and the
# memcheck of the scores cases; test_cuda_policies), timelines of TokenSelect at 32K and 128K, TPOT rounds beside full
# attention: three at 32K, two at 128K.
# c2 and c3 ran this script again with their own new builds (bench/results/s39/README.md).
. bench/gpu_pack_env.sh
{ tst test_cuda_prims --only scores; tst test_cuda_prims --only grow; tst test_cuda_policies
  echo "== memcheck test_cuda_prims --quick --only scores"
  timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_prims --quick --only scores 2>&1 | grep -v "^  ok" | tail -4
} > $O/tests.txt 2>&1; cat $O/tests.txt
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for L in 32768 131040; do for v in base new; do
  echo "== $v tokenselect $L timeline"
  KVSIEVE_POLICY_PATH=$R/$v/policies CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $R/$v/kvsieve $B --lengths $L --policy tokenselect --gen 12 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:' | head -4
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -9; rm -f $R/t.csv
done; done > $O/trace.txt 2>&1
cat $O/trace.txt
for r in 1 2 3; do for v in base new; do echo "== $v 32K round $r"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 32768 --policy none,tokenselect --gen 32 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/r32.txt 2>&1
cat $O/r32.txt
for r in 1 2; do for v in base new; do echo "== $v 128K round $r"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 131040 --policy none,tokenselect --gen 16 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/r128.txt 2>&1
cat $O/r128.txt
