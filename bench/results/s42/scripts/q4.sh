# session 42, q4: Quest's bound kernel with the query's sign read from the double's high word (one 32-bit compare
# a term instead of a 64-bit one; the same bits). base = main. Tests of new, bench_kernels --quest three rounds a
# build, Quest at 128K (budget 4096) two rounds a build.
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
{ echo "== new tests"; timeout 200 $R/new/test_cuda_prims --only bound 2>&1 | tail -1; timeout 200 $R/new/test_cuda_prims --only page 2>&1 | tail -1; KVSIEVE_POLICY_PATH=$R/new/policies timeout 200 $R/new/test_cuda_policies 2>&1 | grep -v "^  ok" | tail -3; } > $O/tests.txt 2>&1
cat $O/tests.txt
for r in 1 2 3; do for v in base new; do echo "== $v round $r"; timeout 100 $R/$v/bench_kernels --quest 2>&1 | grep -E "packed|bounds \+"; done; done > $O/bk.txt 2>&1
cat $O/bk.txt
for r in 1 2; do for v in base new; do echo "== $v quest128 round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 80 $R/$v/kvsieve $B --lengths 131040 --gen 16 --policy quest --set quest.budget=4096 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'; done; done > $O/quest.txt 2>&1
cat $O/quest.txt
