# session 43, a7: Quest at 128K (budget 4096), three rounds a build, base (722409d) and new (57fcd63): is a6's new
# Quest row (6.16 ms against base's 5.75) the run-to-run spread or the change?
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for r in 1 2 3; do for v in base new; do echo "== $v quest128 round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 80 $R/$v/kvsieve $B --lengths 131040 --gen 16 --policy quest --set quest.budget=4096 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'; done; done > $O/quest.txt 2>&1
cat $O/quest.txt
