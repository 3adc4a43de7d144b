# session 35, y6: t1 = g3 + the wide top-k blocks (1024 threads) counting into 128 copies of each bin instead of 32
# (eight threads a copy, as in the 256-thread blocks), the copies in dynamic shared memory. Its top-k tests and their
# memcheck / racecheck, timelines of TokenSelect at 128K and 32K beside g3 (the build before it)
. bench/gpu_pack_env.sh
cp -r $R/t1 $R/new
{ tst test_cuda_prims --only topk; tst test_cuda_prims --only grow
  echo "== memcheck / racecheck --quick --only topk"
  timeout 250 /usr/local/cuda/bin/compute-sanitizer --tool memcheck $R/new/test_cuda_prims --quick --only topk 2>&1 | tail -2
  timeout 250 /usr/local/cuda/bin/compute-sanitizer --tool racecheck $R/new/test_cuda_prims --quick --only topk 2>&1 | tail -2
} > $O/tests.txt 2>&1
for c in "ts128:--lengths 131040 --policy tokenselect" "ts32:--lengths 32768 --policy tokenselect"; do for v in g3 t1 g3 t1; do
  n=${c%%:*}; a=${c#*:}
  echo "== $v $n"
  KVSIEVE_POLICY_PATH=$R/$v/policies CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 $a --gen 12 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -9; rm -f $R/t.csv
done; done > $O/trace.txt 2>&1
cat $O/tests.txt; grep -E "==|wall|sc1_logits|tk_clu|attn_|tokenselect" $O/trace.txt
