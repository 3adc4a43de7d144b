# session 42, t1: timelines (bench/ktrace.c) of Quest (budget 4096) and TokenSelect's hit path (cache_theta -1) at
# 128K on main (pk2's base): a layer's kernels in a steady step, --seq.
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for a in "quest --set quest.budget=4096" "tokenselect --set tokenselect.cache_theta=-1"; do
  echo "== base $a" >> $O/trace.txt
  CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv KVSIEVE_POLICY_PATH=$R/base/policies timeout 90 \
    $R/base/kvsieve $B --gen 12 --policy $a --lengths 131040 2>&1 | grep -E "kvsieve:|ktrace|^[a-z]+ +[0-9]+ " >> $O/trace.txt
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 --seq 40 2>&1 | head -75 >> $O/trace.txt
done
cat $O/trace.txt
