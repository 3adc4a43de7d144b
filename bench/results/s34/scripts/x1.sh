# session 34: p1 = PDL edges inside segments (scores -> top-k, attention -> combine), p2 = p1 + flat join with
# programmatic edges into the list attention; timelines beside base34 (main at c2a9715)
. bench/gpu_pack_env.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
for c in "ts32:--lengths 32768 --policy tokenselect" "full32:--lengths 32768 --policy none" "ts128:--lengths 131040 --policy tokenselect"; do for v in base34 p1 p2 base34 p1 p2; do
  n=${c%%:*}; a=${c#*:}
  echo "== $v $n"
  KS_X_PROG=1 KVSIEVE_POLICY_PATH=$R/$v/policies CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 $a --gen 12 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:|prog edge' | sort | uniq -c
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -11 | tail -n +2; rm -f $R/t.csv
done; done > $O/trace.txt 2>&1
grep -E "==|wall|prog|tokenselect|none" $O/trace.txt
