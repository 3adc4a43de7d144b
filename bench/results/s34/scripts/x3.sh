# session 34: the first decode steps of full attention and TokenSelect (base34): step walls, host calls of the first step
. bench/gpu_pack_env.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
for c in "ts32:32:--lengths 32768 --policy tokenselect --gen 32" "full32:32:--lengths 32768 --policy none --gen 32" "ts128:16:--lengths 131040 --policy tokenselect --gen 16" "full128:16:--lengths 131040 --policy none --gen 16"; do for v in base34; do
  n=${c%%:*}; r=${c#*:}; g=${r%%:*}; a=${r#*:}
  echo "== $v $n"
  KVSIEVE_POLICY_PATH=$R/$v/policies CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 $a 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  python3 bench/ktrace.py $R/t.csv --steps $((g-1)) --skip 0 --walls --host 2>&1 | sed 's/step walls (us): .* \([0-9]* [0-9]* [0-9]* [0-9]* [0-9]* [0-9]* [0-9]* [0-9]* [0-9]* [0-9]* [0-9]* [0-9]* [0-9]* [0-9]* [0-9]* [0-9]* [0-9]* [0-9]* [0-9]* [0-9]*\)$/walls: \1/' | head -24
  echo "-- without step 1"
  python3 bench/ktrace.py $R/t.csv --steps $((g-1)) --skip 1 --host 2>&1 | head -22
  xz -c $R/t.csv > $O/$n.csv.xz; rm -f $R/t.csv
done; done > $O/first.txt 2>&1
grep -E "==|walls:|decode steps" $O/first.txt
