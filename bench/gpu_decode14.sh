# Issue 14, first item (device index lists), on the GPU machine in one call: the CUDA tests of
# the new build, then `kvsieve bench` of the build before (.data/decode/base: commit b290acf)
# and after (.data/decode/new), full and TokenSelect at 32K, alternating. Carry .data/decode
# (stripped, xz'd: base/kvsieve.xz, new/{kvsieve,test_cuda,test_cuda_prims,test_cuda_policies}.xz)
# and .data/stories260K. Usage: bash bench/gpu_decode14.sh [tests] [bench] [memcheck]  (all when none)
S=.data/decode; R=$(mktemp -d); mkdir -p $R/base $R/new
for f in $S/base/*.xz; do xz -dc $f > $R/base/$(basename $f .xz); done
for f in $S/new/*.xz; do xz -dc $f > $R/new/$(basename $f .xz); done
chmod +x $R/*/*
export KS_STORIES=.data/stories260K
N=$R/new
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/card.txt
step_tests() {
    ( timeout 200 $N/test_cuda 2>&1 | grep -v "^  ok" | tail -30
      timeout 60 $N/test_cuda_prims 2>&1 | tail -2
      timeout 60 $N/test_cuda_policies --stories .data/stories260K 2>&1 | tail -4 ) > $OUT/tests.txt
}
step_memcheck() {
    timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 $N/test_cuda --quick --only check_idx 2>&1 | tail -4 > $OUT/memcheck.txt
    echo "rc=${PIPESTATUS[0]}" >> $OUT/memcheck.txt
}
step_bench() {
    C="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --lengths 32768 --gen 32 --repeat 1 --policy none,tokenselect"
    for v in base new base new; do echo "== $v $(date +%T)"; timeout 150 $R/$v/kvsieve $C 2>&1; done > $OUT/bench.txt
}
for s in ${*:-tests bench memcheck}; do echo "== step $s $(date +%T)"; step_$s; done
rm -rf $R
tail -n 40 $OUT/*.txt
