# session 35: two more rounds of TokenSelect beside full attention at 128K (--gen 16, the table's row), each build
. bench/gpu_pack_env.sh
for r in 1 2; do for v in base35 new; do echo "== $v round $r"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 --lengths 131040 --policy none,tokenselect --gen 16 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/r128.txt 2>&1
cat $O/r128.txt
