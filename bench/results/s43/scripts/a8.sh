# session 43, a8: Quest's decode timeline at 128K (bench/ktrace.c; bench/ktrace.py, 8 steps after 2), base (722409d)
# and new (57fcd63), two rounds a build: does the list attention's time a step move?
. bench/gpu_pack_env.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for r in 1 2; do for v in base new; do echo "== $v quest128 round $r"
  CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv KVSIEVE_POLICY_PATH=$R/$v/policies timeout 100 $R/$v/kvsieve $B --lengths 131040 --gen 12 --policy quest --set quest.budget=4096 2>&1 | grep -E "^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:|ktrace"
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -16; rm -f $R/t.csv
done; done > $O/trace.txt 2>&1
cat $O/trace.txt
