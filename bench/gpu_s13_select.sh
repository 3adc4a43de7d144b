# Session 13, issue 14: the one-row scores kernel (kernels/prim_scores1.cu) on the GPU, in one
# device call: the primitive and policy tests of the new build, then TokenSelect beside full
# attention, session 12's final build ("base", .data/s13/base-kvsieve.xz) beside the new one at
# 32K, the new one alone at 128K (defaults and the hit path, cache_theta = -1), and the new one's
# --profile split at 32K. Carry .data/s13 and .data/stories260K.
# Usage: bash bench/gpu_s13_select.sh [tests] [b32] [b128] [prof] [kern] [sync] [noop] [ncu] [b32n] [ncudeep]   (the first four when none)
S=.data/s13; R=$(mktemp -d); mkdir -p $R/base $R/new
[ -f $S/base-kvsieve.xz ] && xz -dc $S/base-kvsieve.xz > $R/base/kvsieve
for f in $S/new/*.xz; do xz -dc $f > $R/new/$(basename $f .xz); done
chmod +x $R/*/*
export KS_STORIES=.data/stories260K NCCL_NVLS_ENABLE=0
N=$R/new
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/card.txt
step_tests() {
    ( timeout 120 $N/test_cuda_prims 2>&1 | grep -v "^  ok" | tail -25
      [ -x $N/test_cuda_policies ] && timeout 150 $N/test_cuda_policies --stories .data/stories260K 2>&1 | tail -8 ) > $OUT/tests.txt
}
step_b32() {
    for v in base new base new; do echo "== $v"; timeout 120 $R/$v/kvsieve $B --lengths 32768 --gen 32 --policy none,tokenselect 2>&1; done > $OUT/b32.txt
    echo "== new hit path" >> $OUT/b32.txt
    timeout 120 $N/kvsieve $B --lengths 32768 --gen 32 --policy tokenselect --set tokenselect.cache_theta=-1 >> $OUT/b32.txt 2>&1
}
step_b32n() {
    ( timeout 120 $N/kvsieve $B --lengths 32768 --gen 32 --policy none,tokenselect 2>&1
      echo "== new hit path"
      timeout 120 $N/kvsieve $B --lengths 32768 --gen 32 --policy tokenselect --set tokenselect.cache_theta=-1 2>&1 ) > $OUT/b32.txt
}
step_b128() {
    ( echo "== new 128K"; timeout 200 $N/kvsieve $B --lengths 131040 --gen 16 --policy none,tokenselect 2>&1
      echo "== new 128K hit path"; timeout 120 $N/kvsieve $B --lengths 131040 --gen 16 --policy tokenselect --set tokenselect.cache_theta=-1 2>&1 ) > $OUT/b128.txt
}
step_prof() {
    timeout 120 $N/kvsieve $B --lengths 32768 --gen 16 --policy tokenselect --profile > $OUT/prof.txt 2>&1
}
step_kern() {
    timeout 120 $N/bench_kernels --select > $OUT/kern.txt 2>&1
}
step_ncu() {
    timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum -k regex:"sc1|tk_|scores" \
        --launch-count 40 $N/bench_kernels --select > $OUT/ncu.txt 2>&1
    grep -E "^  [a-z_0-9]+.*\(|gpu__time|dram__bytes" $OUT/ncu.txt | cut -c1-110 | \
        awk 'NR%3==1{k=$1} NR%3==2{b=$NF" "$(NF-1)} NR%3==0{print k, b, $(NF-1), $NF}' > $OUT/ncu_short.txt
}
step_ncudeep() {
    timeout 120 ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --section MemoryWorkloadAnalysis -k regex:"sc1_logits|tk_hist" --launch-count 2 $N/bench_kernels --select \
        > $OUT/ncudeep.txt 2>&1
}
step_noop() {
    timeout 120 $N/kvsieve $B --lengths 32768 --gen 32 --policy none,noop > $OUT/noop.txt 2>&1
}
step_sync() {
    KS_PROFILE=sync timeout 120 $N/kvsieve $B --lengths 32768 --gen 16 --policy tokenselect > $OUT/sync.txt 2>&1
}
for s in ${*:-tests b32 b128 prof}; do echo "== step $s $(date +%T)"; step_$s; done
rm -rf $R
tail -n 40 $OUT/*.txt
