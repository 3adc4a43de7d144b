. bench/gpu_pack_env.sh
for v in ${VV:-base new}; do
B="$R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
export KVSIEVE_POLICY_PATH=$R/$v/policies
for c in "q128:--lengths 131040 --gen 32 --policy quest --set quest.budget=4096"; do
  n=${c%%:*}; a=${c#*:}
  echo "== $v $n"
  CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$O/$n.csv $B $a 2>&1 | grep -E '^[a-z]+ +[0-9]+ '
  python3 bench/ktrace.py $O/$n.csv --steps 30 --skip 0 --walls | head -2
  rm -f $O/$n.csv
done; done 2>&1 | tee $O/walls.txt
