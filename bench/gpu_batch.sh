# Issue 16's GPU figures in one device call (kind nvidia-h100-x2, GPU 0): the batched decode
# attention's test (vs its CPU twin, its time at the 8B shape beside the per-session path) and
# compute-sanitizer memcheck of its quick tier; then `kvsieve bench --batch` at 4K for B = 1, 4,
# 16, 64 with the TTFT under load (batched attention), and B = 16, 64 with --attn-per-session
# (the per-session path of the same binary); `old`: the same B = 1, 16, 64 rows with an earlier
# build (.data/batch/old/kvsieve.xz) on the same machine; `short`: B = 1, 4, 16, 64 at 128 tokens
# (the step without KV: the dense ops and the per-session costs). Carry .data/batch (stripped,
# xz'd: kvsieve.xz, test_attn_decode_batch.xz[, old/kvsieve.xz]).
# Usage: bash bench/gpu_batch.sh [test] [bench] [ab] [old] [short]   (test bench ab when none)
S=.data/batch; R=$(mktemp -d); mkdir -p $R/old
for f in $S/*.xz; do xz -dc $f > $R/$(basename $f .xz); done
for f in $S/old/*.xz; do [ -f $f ] && xz -dc $f > $R/old/$(basename $f .xz); done
chmod +x $R/* $R/old/* 2>/dev/null
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/card.txt
C="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --lengths 4096 --gen 32"
step_test() {
    ( timeout 120 $R/test_attn_decode_batch 2>&1
      timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 $R/test_attn_decode_batch --quick 2>&1 | tail -4
      echo "memcheck rc=${PIPESTATUS[0]}" ) > $OUT/test.txt
}
step_bench() {
    timeout 300 $R/kvsieve $C --batch 1,4,16,64 --ttft-under-load --json $OUT/bench_batch.json > $OUT/bench.txt 2>&1
}
step_ab() {
    timeout 200 $R/kvsieve $C --batch 16,64 --attn-per-session --json $OUT/bench_ab.json > $OUT/bench_ab.txt 2>&1
}
step_old() {
    timeout 200 $R/old/kvsieve $C --batch 1,16,64 > $OUT/bench_old.txt 2>&1
}
step_short() {
    timeout 120 $R/kvsieve ${C/4096/128} --batch 1,4,16,64 > $OUT/bench_short.txt 2>&1
}
for s in ${*:-test bench ab}; do echo "== step $s $(date +%T)"; step_$s; done
rm -rf $R
cat $OUT/card.txt; tail -n 20 $OUT/test.txt $OUT/bench*.txt 2>/dev/null
