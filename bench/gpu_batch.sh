# Issue 16's GPU figures in one device call (kind nvidia-h100-x2, GPU 0): the batched decode
# attention's test (vs its CPU twin, its time at the 8B shape beside the per-session path) and
# compute-sanitizer memcheck of its quick tier; then `kvsieve bench --batch` at 4K for B = 1, 4,
# 16, 64 with the TTFT under load (batched attention), and B = 16, 64 with --attn-per-session
# (the per-session path of the same binary). Carry .data/batch (stripped, xz'd: kvsieve.xz,
# test_attn_decode_batch.xz). Usage: bash bench/gpu_batch.sh [test] [bench] [ab]   (all when none)
S=.data/batch; R=$(mktemp -d)
for f in $S/*.xz; do xz -dc $f > $R/$(basename $f .xz); done
chmod +x $R/*
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
for s in ${*:-test bench ab}; do echo "== step $s $(date +%T)"; step_$s; done
rm -rf $R
cat $OUT/card.txt; tail -n 20 $OUT/test.txt $OUT/bench.txt $OUT/bench_ab.txt 2>/dev/null
