# session 39, c9: more TPOT rounds of c8's builds (pk8) on the same warm machine: two at 128K, then two at 32K.
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for r in 1 2; do for v in base new; do echo "== $v 128K round $r"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 100 $R/$v/kvsieve $B --lengths 131040 --policy none,tokenselect --gen 16 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/r128.txt 2>&1
cat $O/r128.txt
for r in 1 2; do for v in base new; do echo "== $v 32K round $r"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 60 $R/$v/kvsieve $B --lengths 32768 --policy none,tokenselect --gen 32 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/r32.txt 2>&1
cat $O/r32.txt
