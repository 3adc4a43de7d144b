# session 33: n6 = n4 with the rotation loops sharing one helper (tc_rot_rows): its GPU tests, timelines beside n4
. bench/gpu_pack_env.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
( echo "== n6 test_attn_list"; timeout 250 $R/n6/test_attn_list 2>&1 | grep -v "^  ok" | tail -4
  echo "== n6 test_cuda_policies --stories"; timeout 200 $R/n6/test_cuda_policies --stories .data/stories260K 2>&1 | grep -v "^  ok" | tail -3
  echo "== memcheck n6 test_attn_list --quick"; timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $R/n6/test_attn_list --quick 2>&1 | tail -2
) > $O/tests.txt 2>&1
for c in "ts32:--lengths 32768 --policy tokenselect" "ts128:--lengths 131040 --policy tokenselect"; do for v in n4 n6; do
  n=${c%%:*}; a=${c#*:}
  echo "== $v $n"
  KVSIEVE_POLICY_PATH=$R/$v/policies CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 $a --gen 12 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -9 | grep -E "wall|sc1|attn_|tk_"; rm -f $R/t.csv
done; done > $O/trace.txt 2>&1
cat $O/tests.txt; grep -E "==|wall|attn_decode_tc" $O/trace.txt
