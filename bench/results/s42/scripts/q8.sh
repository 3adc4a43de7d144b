# session 42, q8: the bound kernel's batch check limited to the shape measured (packed boxes, 4 query heads a KV
# head, d <= 128; a box at a time elsewhere). base = main at 5b26da2 (the batch check everywhere), new = the limit.
# GPU tests of new, then bench_kernels --quest's graph line, two rounds a build.
. bench/gpu_pack_env.sh
{ tst test_cuda_prims --only bound; tst test_cuda_prims --only page; tst test_cuda_policies; } > $O/tests.txt 2>&1
cat $O/tests.txt
for r in 1 2; do for v in base new; do echo "== $v round $r"; timeout 100 $R/$v/bench_kernels --quest 2>&1 | grep -E "graph of 20 \(a call\) ctx"; done; done > $O/bk.txt 2>&1
cat $O/bk.txt
