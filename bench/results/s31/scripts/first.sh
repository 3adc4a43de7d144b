. bench/gpu_pack_env.sh
B="$R/new/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
export KVSIEVE_POLICY_PATH=$R/new/policies
for c in "ts128:--lengths 131040 --gen 16 --policy tokenselect" "ts32:--lengths 32768 --gen 16 --policy tokenselect"; do
  n=${c%%:*}; a=${c#*:}
  echo "== $n"
  CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$O/$n.csv $B $a 2>&1 | grep -E '^[a-z]+ +[0-9]+ '
  python3 bench/ktrace.py $O/$n.csv --steps 15 --skip 0 --walls --host | head -60
  echo "-- without the first step"
  python3 bench/ktrace.py $O/$n.csv --steps 15 --skip 1 --host | head -50
  echo "-- steps 2.. without 1,2"
  python3 bench/ktrace.py $O/$n.csv --steps 15 --skip 2 --host | head -50
  rm -f $O/$n.csv
done > $O/first.txt 2>&1
