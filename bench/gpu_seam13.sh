# Issue 13, the coarse forward ops, on the GPU machine in one call: the CUDA tests of the new
# build, then `kvsieve bench` of the build before (.data/seam13/base: commit 0a12c6d) and after
# (.data/seam13/new) alternating. Carry .data/seam13 (stripped, xz'd: base/kvsieve.xz,
# new/{kvsieve,test_cuda,test_cuda_prims,test_cuda_policies,test_wgmma}.xz) and .data/stories260K.
# Usage: bash bench/gpu_seam13.sh [parity] [bench] [variants] [memcheck]   (all four when none)
S=.data/seam13; R=$(mktemp -d); mkdir -p $R/base $R/new
for f in $S/base/*.xz; do xz -dc $f > $R/base/$(basename $f .xz); done
for f in $S/new/*.xz; do xz -dc $f > $R/new/$(basename $f .xz); done
chmod +x $R/*/*
export KS_STORIES=.data/stories260K
N=$R/new
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/card.txt
step_parity() { ( $N/test_cuda 2>&1 | grep -v "^  ok" | tail -30 ) > $OUT/test_cuda.txt; }
step_variants() {
    ( for v in "--quick --pdl" "--quick --no-graphs" "--quick --plain" "--quick --basic-decode" "--mma-prefill"; do
          echo "== test_cuda $v"; $N/test_cuda $v 2>&1 | grep -v "^  ok" | tail -4; done ) > $OUT/test_cuda_variants.txt
    ( $N/test_cuda_prims 2>&1 | tail -2; $N/test_cuda_policies --stories .data/stories260K 2>&1 | tail -4
      $N/test_wgmma --quick 2>&1 | tail -4 ) > $OUT/test_prims_policies_wgmma.txt
}
step_memcheck() {
    compute-sanitizer --tool memcheck --error-exitcode 1 $N/test_cuda --quick 2>&1 | tail -12 > $OUT/memcheck.txt
    echo "rc=${PIPESTATUS[0]}" >> $OUT/memcheck.txt
    timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 $N/test_wgmma --quick 2>&1 | tail -4 >> $OUT/memcheck.txt
    echo "test_wgmma rc=${PIPESTATUS[0]}" >> $OUT/memcheck.txt
}
step_bench() {
    C="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --lengths 8192,32768 --gen 32 --repeat 1"
    for v in base new base new base new; do echo "== $v"; $R/$v/kvsieve $C 2>&1; done > $OUT/bench.txt
}
for s in ${*:-parity bench variants memcheck}; do echo "== step $s $(date +%T)"; step_$s; done
rm -rf $R
tail -n 6 $OUT/*.txt
