# session 36, z1: base36 (main's code) beside v1 (joined steps flat, the list attention behind a programmatic edge from
# the top-k's launch, its wait after the block's setup) and v2 (v1 + the scores kernel behind one from the q|k|v gemv,
# its first tile loaded before the wait). Timelines of TokenSelect at 32K, then TPOT rounds beside full attention.
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for v in base36 v1 v2; do
  echo "== $v ts32 timeline"
  KVSIEVE_POLICY_PATH=$R/$v/policies CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $R/$v/kvsieve $B --lengths 32768 --policy tokenselect --gen 12 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:|\[x\]' | sort | uniq -c | sort -rn | head -8
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -9; rm -f $R/t.csv
done > $O/trace.txt 2>&1
cat $O/trace.txt
for r in 1 2; do for v in base36 v1 v2; do echo "== $v 32K round $r"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 32768 --policy none,tokenselect --gen 32 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/r32.txt 2>&1
cat $O/r32.txt
for v in base36 v1 v2; do echo "== $v 128K"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 131040 --policy none,tokenselect --gen 16 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done > $O/r128.txt 2>&1
cat $O/r128.txt
