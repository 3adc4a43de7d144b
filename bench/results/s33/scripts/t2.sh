# session 33: list attention with bulk copies (n2) — its tests, then TokenSelect's timelines beside main's (base33)
. bench/gpu_pack_env.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
( echo "== test_attn_list --quick"; timeout 200 $R/n2/test_attn_list --quick 2>&1 | grep -v "^  ok" | tail -6
  echo "== test_cuda_policies"; KS_STORIES=.data/stories260K timeout 200 $R/n2/test_cuda_policies 2>&1 | grep -v "^  ok" | tail -4
  echo "== test_cuda --quick"; timeout 250 $R/n2/test_cuda --quick 2>&1 | grep -v "^  ok" | tail -4
) > $O/tests.txt 2>&1
for c in "ts32:--lengths 32768" "ts128:--lengths 131040"; do for v in base33 n2; do
  n=${c%%:*}; a=${c#*:}
  echo "== $v $n"
  KVSIEVE_POLICY_PATH=$R/$v/policies CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 $a --policy tokenselect --gen 12 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -9; rm -f $R/t.csv
done; done > $O/trace.txt 2>&1
cat $O/tests.txt $O/trace.txt
