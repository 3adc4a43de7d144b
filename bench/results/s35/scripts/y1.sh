# session 35, y1: a1 = the scores kernel's second grid barrier replaced by a counter a run of rows (its last
# block sums the run's columns) and the top-k launched for programmatic dependent launch behind it: its GPU
# tests, timelines beside base35 (TokenSelect 32K and 128K, twice each), TPOT rounds beside full attention
. bench/gpu_pack_env.sh
cp -r $R/a1 $R/new
{ tst test_cuda_prims --only scores; tst test_cuda_prims --only grow; tst test_cuda_prims --only topk
  echo "== memcheck scores+topk --quick"
  timeout 200 /usr/local/cuda/bin/compute-sanitizer --tool memcheck $R/new/test_cuda_prims --quick --only scores 2>&1 | tail -3
  timeout 200 /usr/local/cuda/bin/compute-sanitizer --tool memcheck $R/new/test_cuda_prims --quick --only topk 2>&1 | tail -3
  timeout 200 /usr/local/cuda/bin/compute-sanitizer --tool racecheck $R/new/test_cuda_prims --quick --only scores 2>&1 | tail -3
} > $O/tests.txt 2>&1
for c in "ts32:--lengths 32768 --policy tokenselect" "ts128:--lengths 131040 --policy tokenselect"; do for v in base35 a1 base35 a1; do
  n=${c%%:*}; a=${c#*:}
  echo "== $v $n"
  KVSIEVE_POLICY_PATH=$R/$v/policies CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 $a --gen 12 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -9; rm -f $R/t.csv
done; done > $O/trace.txt 2>&1
for r in 1 2; do for v in base35 a1; do
  echo "== $v round $r"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 200 $R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 --lengths 32768 --policy none,tokenselect --gen 32 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 200 $R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 --lengths 131040 --policy none,tokenselect --gen 16 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/tpot.txt 2>&1
cat $O/tests.txt; grep -E "==|wall|sc1_logits|tk_clu|tokenselect" $O/trace.txt; cat $O/tpot.txt
