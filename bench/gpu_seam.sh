# Issue 13 on the GPU machine: the CUDA tests of the options build, and `kvsieve bench` of the build
# before (.data/seam/base) and after (.data/seam/new) in one call. xz'd stripped binaries: carry
# .data/seam/base and .data/seam/new (kvsieve each) for `bench`, .data/seam/newtests (test_cuda,
# test_cuda_prims, test_cuda_policies, test_wgmma) and .data/stories260K for `tests` / `wgmma`
# (together they pass the 64 MiB a call carries). Usage: bash bench/gpu_seam.sh tests|bench|wgmma
set -x
S=.data/seam; mkdir -p $S/run/base $S/run/new
for f in $S/base/*.xz; do [ -f $f ] && xz -dc $f > $S/run/base/$(basename $f .xz); done
for f in $S/new/*.xz $S/newtests/*.xz; do [ -f $f ] && xz -dc $f > $S/run/new/$(basename $f .xz); done
chmod +x $S/run/*/* 2>/dev/null
export KS_STORIES=.data/stories260K
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/card.txt
N=$S/run/new
case "$1" in
tests)
    ( $N/test_cuda 2>&1 | grep -v "^  ok" | tail -40 ) > $OUT/test_cuda.txt
    ( $N/test_cuda --quick --pdl 2>&1 | tail -3; $N/test_cuda --quick --no-graphs 2>&1 | tail -3
      $N/test_cuda --mma-prefill 2>&1 | tail -3 ) > $OUT/test_cuda_variants.txt
    ( $N/test_cuda_prims 2>&1 | tail -3; $N/test_cuda_policies --stories .data/stories260K 2>&1 | tail -8
      $N/test_wgmma --quick 2>&1 | tail -12 ) > $OUT/test_prims_policies_wgmma_quick.txt
    ;;
bench)
    C="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --lengths 8192,32768 --gen 32 --repeat 1"
    for v in base new base new base new base new; do echo "== $v"; $S/run/$v/kvsieve $C 2>&1; done > $OUT/bench.txt
    ;;
wgmma)
    $N/test_cuda --only "two backends" > $OUT/test_cuda_two_backends.txt 2>&1
    $N/test_wgmma > $OUT/test_wgmma.txt 2>&1; echo "rc=$?" >> $OUT/test_wgmma.txt
    ;;
esac
tail -n 5 $OUT/*.txt
