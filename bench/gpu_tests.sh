# `make test-cuda` on the GPU machine from prebuilt binaries (.data/bins.tar.xz), plus sanitizer runs.
set -x
B=.data/run; mkdir -p $B && tar -C $B -xJf .data/bins.tar.xz
export KS_STORIES=.data/stories260K
( $B/test_cuda 2>&1 | grep -v "^  ok" | tail -20 ) > $OUT/test_cuda.txt
( $B/test_cuda --mma-prefill 2>&1 | tail -3 ) > $OUT/test_cuda_nowgmma.txt
( $B/test_cuda --quick --no-graphs 2>&1 | tail -3 ) > $OUT/test_cuda_nograph.txt
[ -x $B/test_cuda_prims ] && ( $B/test_cuda_prims 2>&1 | tail -3 ) > $OUT/test_cuda_prims.txt
( $B/test_cuda_policies --stories .data/stories260K 2>&1 | tail -30 ) > $OUT/test_cuda_policies.txt
( $B/test_wgmma 2>&1 | tail -8 ) > $OUT/test_wgmma.txt
( compute-sanitizer --tool memcheck --error-exitcode 1 $B/test_cuda --quick 2>&1 | tail -4; echo "rc=$?" ) > $OUT/san_test_cuda.txt
[ -x $B/test_cuda_prims ] && ( compute-sanitizer --tool memcheck --error-exitcode 1 $B/test_cuda_prims --quick 2>&1 | tail -3 ) > $OUT/san_prims.txt
( compute-sanitizer --tool memcheck --error-exitcode 1 $B/test_cuda_policies --quick --stories .data/stories260K 2>&1 | tail -3 ) > $OUT/san_policies.txt
tail -n 4 $OUT/*.txt
