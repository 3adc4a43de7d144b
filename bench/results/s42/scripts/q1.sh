# session 42, q1: Quest's bound kernel with the next boxes' loads in flight while a batch is summed
# (kernels/prim_page.cu; B = two register sets, 8 boxes a batch, 3 blocks an SM; C = two sets of 4
# boxes, 4 blocks an SM). base = main (one set, loads after the sums). Tests of B and C, bench_kernels
# --quest (two rounds a build), then Quest at 128K (budget 4096) for each build, two rounds, with full
# attention once.
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for v in B C; do echo "== $v tests"; timeout 200 $R/$v/test_cuda_prims --only bound 2>&1 | tail -2; timeout 200 $R/$v/test_cuda_prims --only page 2>&1 | tail -1; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 200 $R/$v/test_cuda_policies 2>&1 | grep -v "^  ok" | tail -4; done > $O/tests.txt 2>&1
cat $O/tests.txt
for r in 1 2; do for v in base B C; do echo "== $v round $r"; timeout 100 $R/$v/bench_kernels --quest 2>&1 | grep -E "bound_scores|all four|bounds \+"; done; done > $O/bk.txt 2>&1
cat $O/bk.txt
for r in 1 2; do for v in base B C; do echo "== $v quest128 round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 80 $R/$v/kvsieve $B --lengths 131040 --gen 16 --policy quest --set quest.budget=4096 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'; done; done > $O/quest.txt 2>&1
echo "== base full128"; KVSIEVE_POLICY_PATH=$R/base/policies timeout 80 $R/base/kvsieve $B --lengths 131040 --gen 16 --policy none 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:' >> $O/quest.txt
cat $O/quest.txt
