# Session 12's closing GPU check, in one device call: the CUDA tests of the final build
# (.data/s12/new), compute-sanitizer on the quick tier, and `kvsieve bench` of the session's first
# commit (.data/s12/base: 0a12c6d) beside the final build, then the decode-time policies
# (TokenSelect, Quest) beside full attention at 32K and 128K on the final build. Carry .data/s12
# (stripped, xz'd: base/kvsieve.xz, new/{kvsieve,test_cuda,test_cuda_prims,test_cuda_policies,
# test_wgmma}.xz) and .data/stories260K. Usage: bash bench/gpu_final_s12.sh [tests] [memcheck]
# [bench] [policies]   (all four when none)
S=.data/s12; R=$(mktemp -d); mkdir -p $R/base $R/new
for f in $S/base/*.xz; do xz -dc $f > $R/base/$(basename $f .xz); done
for f in $S/new/*.xz; do xz -dc $f > $R/new/$(basename $f .xz); done
chmod +x $R/*/*
export KS_STORIES=.data/stories260K
N=$R/new
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/card.txt
step_tests() {
    ( timeout 240 $N/test_cuda 2>&1 | grep -v "^  ok" | tail -20
      timeout 90 $N/test_cuda_prims 2>&1 | tail -2
      timeout 120 $N/test_cuda_policies --stories .data/stories260K 2>&1 | tail -6
      timeout 120 $N/test_wgmma --quick 2>&1 | tail -3 ) > $OUT/tests.txt
}
step_memcheck() {
    timeout 200 compute-sanitizer --tool memcheck --error-exitcode 1 $N/test_cuda --quick 2>&1 | tail -6 > $OUT/memcheck.txt
    echo "rc=${PIPESTATUS[0]}" >> $OUT/memcheck.txt
}
step_bench() {
    C="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --lengths 8192,32768 --gen 32 --repeat 1"
    for v in base new base new; do echo "== $v"; timeout 150 $R/$v/kvsieve $C 2>&1; done > $OUT/bench.txt
}
step_policies128() {
    P="--policy none,tokenselect,quest --set quest.budget=4096 --set quest.page=16"
    ( echo "== 128K"; timeout 400 $N/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda \
          --lengths 131040 --gen 16 --repeat 1 $P 2>&1 ) > $OUT/policies128.txt
}
step_policies() {
    P="--policy none,tokenselect,quest --set quest.budget=4096 --set quest.page=16"
    ( echo "== 32K"; timeout 200 $N/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda \
          --lengths 32768 --gen 32 --repeat 1 $P 2>&1
      echo "== 128K"; timeout 300 $N/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda \
          --lengths 131040 --gen 16 --repeat 1 $P 2>&1 ) > $OUT/policies.txt
}
for s in ${*:-tests memcheck bench policies}; do echo "== step $s $(date +%T)"; step_$s; done
rm -rf $R
tail -n 12 $OUT/*.txt
