# session 34: TPOT at several --gen (warm-up = TPOT(g) x g - steady x g), full and TokenSelect, base34; then 3 repeats
. bench/gpu_pack_env.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda"
for c in "32768:16" "32768:64" "32768:16" "32768:64" "131040:16" "131040:48"; do
  L=${c%%:*}; g=${c#*:}
  echo "== $L gen $g"
  KVSIEVE_POLICY_PATH=$R/base34/policies timeout 200 $R/base34/kvsieve $B --repeat 1 --lengths $L --gen $g --policy none,tokenselect 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done > $O/gen.txt 2>&1
for L in 32768; do
  echo "== $L gen 16 repeat 3"
  KVSIEVE_POLICY_PATH=$R/base34/policies timeout 200 $R/base34/kvsieve $B --repeat 3 --lengths $L --gen 16 --policy none,tokenselect --json $O/rep.json 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done >> $O/gen.txt 2>&1
cat $O/gen.txt; grep -o '"tpot_ms": {[^}]*}' $O/rep.json
