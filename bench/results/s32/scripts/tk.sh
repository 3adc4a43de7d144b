# session 32: the o-projection's weights prefetched into L2 (one bulk prefetch a block, evict_last) by the
# top-k kernel (vT), KS_CUDA_WPF=0 / 1 in one binary: timelines, then TPOT rounds beside full
. bench/gpu_pack_env.sh
export KVSIEVE_POLICY_PATH=$R/vT/policies LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
B="$R/vT/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for c in "ts128:--lengths 131040 --policy tokenselect" "ts32:--lengths 32768 --policy tokenselect" "quest128:--lengths 131040 --policy quest --set quest.budget=4096"; do for w in 0 1; do
  n=${c%%:*}; a=${c#*:}
  echo "== $n wpf=$w"
  KS_CUDA_WPF=$w CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $B $a --gen 12 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -24; rm -f $R/t.csv
done; done > $O/trace.txt 2>&1
for w in 0 1 0 1; do
  KS_CUDA_WPF=$w timeout 200 $B --lengths 32768 --gen 32 --policy none,tokenselect 2>&1 | grep -E '^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:' | sed "s/^/32K wpf=$w: /"
  KS_CUDA_WPF=$w timeout 200 $B --lengths 131040 --gen 16 --policy none,tokenselect 2>&1 | grep -E '^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:' | sed "s/^/128K wpf=$w: /"
done > $O/ab.txt 2>&1
