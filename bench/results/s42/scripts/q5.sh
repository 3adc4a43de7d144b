# session 42, q5: Quest's bound kernel with the finite check of a batch's U boxes done first, branch-free, and the
# batch's sums then straight-line (F; the batch takes bound_term when any value is not finite: the same bits);
# G = F with the sign test on the double's high word; H = F with 3 blocks an SM. base = main. Tests of each,
# bench_kernels --quest two rounds a build, Quest at 128K (budget 4096) two rounds of base, F and H.
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for v in F G H; do echo "== $v tests"; timeout 200 $R/$v/test_cuda_prims --only bound 2>&1 | tail -1; timeout 200 $R/$v/test_cuda_prims --only page 2>&1 | tail -1; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 200 $R/$v/test_cuda_policies 2>&1 | grep -v "^  ok" | tail -2; done > $O/tests.txt 2>&1
cat $O/tests.txt
for r in 1 2; do for v in base F G H; do echo "== $v round $r"; timeout 100 $R/$v/bench_kernels --quest 2>&1 | grep -E "packed|bounds \+"; done; done > $O/bk.txt 2>&1
cat $O/bk.txt
for r in 1 2; do for v in base F H; do echo "== $v quest128 round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 80 $R/$v/kvsieve $B --lengths 131040 --gen 16 --policy quest --set quest.budget=4096 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'; done; done > $O/quest.txt 2>&1
cat $O/quest.txt
