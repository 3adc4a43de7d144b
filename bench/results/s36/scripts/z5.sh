# session 36, z5: base36 beside v3 (scripts/v4.diff without its early copies: the joined step flat, the list attention
# behind a programmatic edge from a handler's last kernel, its query rotated before the wait), TPOT rounds only (no
# tracer: session 36 found it inflates long graphs' idle), alternating: four at 32K, three at 128K
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for r in 1 2 3 4; do for v in base36 v3; do echo "== $v 32K round $r"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 32768 --policy none,tokenselect --gen 32 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/r32.txt 2>&1
cat $O/r32.txt
for r in 1 2 3; do for v in base36 v3; do echo "== $v 128K round $r"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 131040 --policy none,tokenselect --gen 16 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/r128.txt 2>&1
cat $O/r128.txt
