# session 34: w6 = the list instances with 6 warps a block (RM 2: 2 stages) against base34: GPU tests, timelines
. bench/gpu_pack_env.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
cp -r $R/w6 $R/new
{ tst test_attn_list; tst test_cuda_policies; } > $O/tests.txt 2>&1
for c in "ts32:--lengths 32768 --policy tokenselect" "ts128:--lengths 131040 --policy tokenselect" "quest128:--lengths 131040 --policy quest --set quest.budget=4096"; do for v in base34 w6 base34 w6; do
  n=${c%%:*}; a=${c#*:}
  echo "== $v $n"
  KVSIEVE_POLICY_PATH=$R/$v/policies CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 $a --gen 12 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -9; rm -f $R/t.csv
done; done > $O/trace.txt 2>&1
cat $O/tests.txt; grep -E "==|wall|attn_decode_tc|tokenselect|quest" $O/trace.txt
