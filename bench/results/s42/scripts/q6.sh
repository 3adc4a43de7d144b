# session 42, q6: the bound kernel timed as a graph of 20 calls (bench_kernels --quest's new line), base against G
# (q5's F with q4's compare), four rounds a build, then Quest at 128K two rounds a build.
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for r in 1 2 3 4; do for v in base G; do echo "== $v round $r"; timeout 100 $R/$v/bench_kernels --quest 2>&1 | grep -E "packed"; done; done > $O/bk.txt 2>&1
cat $O/bk.txt
for r in 1 2; do for v in base G; do echo "== $v quest128 round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 80 $R/$v/kvsieve $B --lengths 131040 --gen 16 --policy quest --set quest.budget=4096 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'; done; done > $O/quest.txt 2>&1
cat $O/quest.txt
