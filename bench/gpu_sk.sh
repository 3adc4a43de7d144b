# The skinny GEMM's GPU figures (issue 16: the batched decode step's dense layers) in one device
# call, GPU 0, under a deadline (DEADLINE seconds, default 170): each step runs
# only while the call's wall time is under its limit, and none fails the call. Outputs: $OUT/sk/.
#   test     test_gemm_rows: kernel and backend ops against the CPU backend's matmul
#   ops      test_gemm_rows --quick --bench: the 8B shapes at n = 1, 4, 16, 64 (before: convert +
#            cuBLAS; cuBLAS alone; the skinny kernel with its K split swept)
#   short    kvsieve bench at 128 tokens, B = 1, 4, 16, 64: this build, then main before it (one file)
#   long     the same at 4096 tokens with --ttft-under-load, both builds (one file)
#   parity   test_cuda --quick (every backend op and end-to-end prefill / decode against the CPU:
#            the q|k|v of prefills of up to 16 rows takes the skinny GEMM), .data/stories260K if carried
#   memcheck compute-sanitizer memcheck of test_gemm_rows --quick
#   prof     nsys (when installed): the GPU kernels of B = 16 at 128 tokens, both builds
# Carry .data/sk (stripped, xz'd: test_gemm_rows.xz, kvsieve.xz[, test_cuda.xz]) and .data/base
# (kvsieve.xz: main before this session's work). Usage: bash bench/gpu_sk.sh [step ...]
# (default: test short long parity ops memcheck: 7 output files, about 150 s)
T0=$(date +%s); DEADLINE=${DEADLINE:-170}
S=.data/sk; O="$OUT/sk"; mkdir -p "$O"; R=$(mktemp -d)
for f in $S/*.xz; do xz -dc $f > $R/$(basename $f .xz); done
xz -dc .data/base/kvsieve.xz > $R/kvsieve-base
chmod +x $R/* 2>/dev/null
export CUDA_VISIBLE_DEVICES=0 NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader > "$O/card.txt"
C="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --gen 32 --batch 1,4,16,64"
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
run() { # run LIMIT CMD...: at most LIMIT seconds and never past the deadline
    local l=$1 r; shift; r=$(left); [ $r -lt $l ] && l=$r
    if [ $l -lt 5 ]; then echo "skipped: $(left) s left"; return; fi
    timeout $l "$@" 2>&1; echo "rc=$? ($(( $(date +%s) - T0 )) s into the call)"
}
step_test() { run 25 $R/test_gemm_rows > "$O/test.txt"; }
step_parity() {
    [ -x $R/test_cuda ] || { echo "no test_cuda carried" > "$O/test_cuda.txt"; return; }
    KS_STORIES=.data/stories260K; export KS_STORIES; run 60 $R/test_cuda --quick | grep -v "^  ok" | tail -20 > "$O/test_cuda.txt"
}
step_ops() { run 40 $R/test_gemm_rows --quick --bench > "$O/ops.txt"; }
step_short() {
    ( echo "== new"; run 25 $R/kvsieve $C --lengths 128; echo "== base"; run 25 $R/kvsieve-base $C --lengths 128 ) > "$O/short.txt"
}
step_long() {
    ( echo "== new"; run 45 $R/kvsieve $C --lengths 4096 --ttft-under-load
      echo "== base"; run 45 $R/kvsieve-base $C --lengths 4096 --ttft-under-load ) > "$O/long.txt"
}
step_memcheck() {
    CS=compute-sanitizer; command -v $CS >/dev/null || CS=/usr/local/cuda/bin/compute-sanitizer
    run 40 $CS --tool memcheck --error-exitcode 1 $R/test_gemm_rows --quick | tail -5 > "$O/memcheck.txt"
}
step_prof() {
    local N=nsys; command -v $N >/dev/null || N=/usr/local/cuda/bin/nsys
    [ -x "$(command -v $N)" ] || { echo "no nsys" > "$O/prof.txt"; return; }
    for v in kvsieve kvsieve-base; do
        run 40 $N profile -o $R/p_$v --force-overwrite true $R/$v ${C/1,4,16,64/16} --lengths 128 > /dev/null
        echo "== $v"; run 30 $N stats --report cuda_gpu_kern_sum --format csv $R/p_$v.nsys-rep
    done >> "$O/prof.txt"
}
for s in ${*:-test short long parity ops memcheck}; do echo "== step $s at $(( $(date +%s) - T0 )) s"; step_$s; done
rm -rf $R
cat "$O/card.txt"; tail -n 8 "$O"/*.txt 2>/dev/null | cut -c1-200
true
