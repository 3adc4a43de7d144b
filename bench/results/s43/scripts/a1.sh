# session 43, a1: Quest's bound kernel, the batch form's ends selected as doubles' high words (M: a mask a query
# value, P: a compare a term, Q: M with 4 boxes a batch and 5 blocks an SM) against base (main, 722409d).
# GPU tests of M, P, Q; bench_kernels --quest's lines, three rounds a build; Quest's step at 128K, two rounds.
. bench/gpu_pack_env.sh
for v in M P Q; do for t in bound page; do echo "== $v test_cuda_prims --only $t"; timeout 120 $R/$v/test_cuda_prims --only $t 2>&1 | grep -v "^  ok" | tail -3; done; done > $O/tests.txt 2>&1
cat $O/tests.txt
for r in 1 2 3; do for v in base M P Q; do echo "== $v round $r"; timeout 100 $R/$v/bench_kernels --quest 2>&1 | grep -E "packed"; done; done > $O/bk.txt 2>&1
grep -E '==|graph' $O/bk.txt
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for r in 1 2; do for v in base M Q; do echo "== $v quest128 round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 80 $R/$v/kvsieve $B --lengths 131040 --gen 16 --policy quest --set quest.budget=4096 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'; done; done > $O/quest.txt 2>&1
cat $O/quest.txt
