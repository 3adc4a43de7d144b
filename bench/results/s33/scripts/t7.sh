# session 33: n7 = HEAD + cudaDeviceSetCacheConfig(cudaFuncCachePreferShared) at backend creation (one carveout for every
# kernel: no shared-memory reconfiguration between kernels) against n6 (HEAD): timelines of TokenSelect and full at 32K and 128K
. bench/gpu_pack_env.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
for c in "ts32:--lengths 32768 --policy tokenselect" "full32:--lengths 32768 --policy none" "ts128:--lengths 131040 --policy tokenselect" "full128:--lengths 131040 --policy none"; do for v in n6 n7 n6 n7; do
  n=${c%%:*}; a=${c#*:}
  echo "== $v $n"
  KVSIEVE_POLICY_PATH=$R/$v/policies CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 $a --gen 12 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -11 | tail -n +2; rm -f $R/t.csv
done; done > $O/trace.txt 2>&1
grep -E "==|wall" $O/trace.txt
