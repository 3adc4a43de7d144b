# session 32: a step's joined graphs flattened (vF) against child graph nodes (vC run with KS_CUDA_WPF=0 = HEAD)
. bench/gpu_pack_env.sh
export KS_CUDA_WPF=0 LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
for c in "ts128:--lengths 131040 --policy tokenselect" "ts32:--lengths 32768 --policy tokenselect" "hit128:--lengths 131040 --policy tokenselect --set tokenselect.cache_theta=-1"; do for v in vC vF; do
  n=${c%%:*}; a=${c#*:}
  echo "== $v $n"
  KVSIEVE_POLICY_PATH=$R/$v/policies CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 $a --gen 12 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -24; rm -f $R/t.csv
done; done > $O/trace.txt 2>&1
for r in 1 2; do for v in vC vF; do
  B="$R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 200 $B --lengths 32768 --gen 32 --policy none,tokenselect 2>&1 | grep -E '^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:' | sed "s/^/32K $v: /"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 200 $B --lengths 131040 --gen 16 --policy none,tokenselect 2>&1 | grep -E '^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:' | sed "s/^/128K $v: /"
done; done > $O/ab.txt 2>&1
