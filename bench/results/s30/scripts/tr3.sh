. bench/gpu_pack_env.sh
v=new
B="$R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
export KVSIEVE_POLICY_PATH=$R/$v/policies
for c in "full32:--lengths 32768 --gen 32 --policy none" "ts32:--lengths 32768 --gen 32 --policy tokenselect" "full128:--lengths 131040 --gen 16 --policy none" "ts128:--lengths 131040 --gen 16 --policy tokenselect" "q128:--lengths 131040 --gen 16 --policy quest --set quest.budget=4096"; do
  n=${c%%:*}; a=${c#*:}
  echo "== $n"; $B $a 2>&1 | grep -E '^[a-z]+ +[0-9]+ '
  CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$O/$n.csv $B $a > /dev/null 2>&1
  python3 bench/ktrace.py $O/$n.csv --steps 8 --skip 2 --walls | head -3
  rm -f $O/$n.csv
done 2>&1 | tee $O/walls.txt
