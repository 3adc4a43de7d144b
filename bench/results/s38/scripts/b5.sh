# session 38, b5: kept (e76b6f2) beside new (e76b6f2 + tk_clu ranking a chosen bin of at most 256 keys at once instead
# of passing over it again). GPU tests of new (test_cuda_prims --only topk and its memcheck --quick, test_cuda_policies
# with stories260K), timelines of TokenSelect at 32K, TPOT rounds beside full attention: three at 32K, two at 128K.
. bench/gpu_pack_env.sh
{ tst test_cuda_prims --only topk; tst test_cuda_policies
  echo "== memcheck test_cuda_prims --quick --only topk"
  timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_prims --quick --only topk 2>&1 | grep -v "^  ok" | tail -4
} > $O/tests.txt 2>&1; cat $O/tests.txt
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for v in kept new; do
  echo "== $v tokenselect 32K timeline"
  KVSIEVE_POLICY_PATH=$R/$v/policies CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $R/$v/kvsieve $B --lengths 32768 --policy tokenselect --gen 12 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:' | head -4
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -9; rm -f $R/t.csv
done > $O/trace.txt 2>&1
cat $O/trace.txt
for r in 1 2 3; do for v in kept new; do echo "== $v 32K round $r"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 32768 --policy none,tokenselect --gen 32 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/r32.txt 2>&1
cat $O/r32.txt
for r in 1 2; do for v in kept new; do echo "== $v 128K round $r"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 131040 --policy none,tokenselect --gen 16 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/r128.txt 2>&1
cat $O/r128.txt
