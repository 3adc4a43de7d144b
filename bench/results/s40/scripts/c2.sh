# session 40, c2: device timelines (bench/ktrace.c) of s39's pk8 new build (db279da) on an H200: full attention at 32K
# and 128K, TokenSelect's hit path (cache_theta -1) at 32K and 128K, TokenSelect at 128K.
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
for c in "full32|--lengths 32768 --policy none" "hit32|--lengths 32768 --policy tokenselect --set tokenselect.cache_theta=-1" \
  "full128|--lengths 131040 --policy none" "hit128|--lengths 131040 --policy tokenselect --set tokenselect.cache_theta=-1" \
  "ts128|--lengths 131040 --policy tokenselect"; do
  echo "== new ${c%%|*}"
  CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv KVSIEVE_POLICY_PATH=$R/new/policies timeout 100 \
    $R/new/kvsieve $B --gen 12 ${c#*|} 2>&1 | grep -E "^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:|ktrace"
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -24; rm -f $R/t.csv
done > $O/trace.txt 2>&1
cat $O/trace.txt
