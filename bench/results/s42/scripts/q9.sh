# session 42, q9: the bound kernel's two branches written through one lambda (box_sums); base = 742d5a0.
# GPU tests of new, then bench_kernels --quest's graph line, two rounds a build.
. bench/gpu_pack_env.sh
{ tst test_cuda_prims --only bound; tst test_cuda_prims --only page; tst test_cuda_policies; } > $O/tests.txt 2>&1
cat $O/tests.txt
for r in 1 2; do for v in base new; do echo "== $v round $r"; timeout 100 $R/$v/bench_kernels --quest 2>&1 | grep -E "graph of 20 \(a call\) ctx"; done; done > $O/bk.txt 2>&1
cat $O/bk.txt
