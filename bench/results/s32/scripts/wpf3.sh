# session 32: the o-projection's weights prefetched into L2 (evict_last) from the scores kernel, after
# its first barrier (vA) or at its end (vB); A/B with KS_CUDA_WPF=0 / 1
. bench/gpu_pack_env.sh
export KVSIEVE_POLICY_PATH=$R/vC/policies LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
for v in vC vD; do
B="$R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for c in "ts128:--lengths 131040" "ts32:--lengths 32768"; do for w in 0 1; do
  n=${c%%:*}; a=${c#*:}
  echo "== $v $n wpf=$w"
  KS_CUDA_WPF=$w CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $B $a --gen 12 --policy tokenselect 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -24; rm -f $R/t.csv
done; done; done > $O/trace.txt 2>&1
