# session 32: the o-projection's weights prefetched into L2 during a short decode attention, A/B in one
# binary (KS_CUDA_WPF=0 / 1): TokenSelect's timelines at 128K and 32K, then TPOT rounds beside full
. bench/gpu_pack_env.sh
B="$R/new/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
export KVSIEVE_POLICY_PATH=$R/new/policies LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
for c in "ts128:--lengths 131040" "ts32:--lengths 32768"; do for w in 0 1; do
  n=${c%%:*}; a=${c#*:}
  echo "== $n wpf=$w"
  KS_CUDA_WPF=$w CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $B $a --gen 12 --policy tokenselect 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -24; rm -f $R/t.csv
done; done > $O/trace.txt 2>&1
for w in 0 1 0 1; do
  KS_CUDA_WPF=$w timeout 200 $B --lengths 32768 --gen 32 --policy none,tokenselect 2>&1 | grep -E '^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:' | sed "s/^/32K wpf=$w: /"
  KS_CUDA_WPF=$w timeout 200 $B --lengths 131040 --gen 16 --policy none,tokenselect 2>&1 | grep -E '^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:' | sed "s/^/128K wpf=$w: /"
done > $O/ab.txt 2>&1
