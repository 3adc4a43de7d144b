. bench/gpu_pack_env.sh
B="$R/base/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
export KVSIEVE_POLICY_PATH=$R/base/policies
for c in "quest128:--lengths 131040 --gen 12 --policy quest --set quest.budget=4096" "ts32:--lengths 32768 --gen 12 --policy tokenselect" "q32:--lengths 32768 --gen 12 --policy quest --set quest.budget=4096"; do
  n=${c%%:*}; a=${c#*:}
  echo "== $n"; CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$O/$n.csv $B $a 2>&1 | tail -1
  python3 bench/ktrace.py $O/$n.csv --steps 8 --skip 2 --host
  xz -9 $O/$n.csv
done 2>&1 | tee $O/trace.txt
