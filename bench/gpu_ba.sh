# Issue 16, the batched decode attention on the tensor cores (helper "battn", session 14): its
# GPU figures in one device call (GPU 0), every step under a deadline (DEADLINE seconds from the
# start, default 230) so the outputs come back inside the call. Outputs under $OUT/ba/.
#   test      test_attn_decode_batch (full tier): the kernel against its CPU twin on every case,
#             then one 8B layer's time at B = 1, 4, 16, 64 x 4096 keys and 16 x 32768 (the
#             per-session path beside it at 4096), and B = 64, 16 at 4, 8, 16 warps an SM
#   base      the same times (--time-only) with the kernel before this work: the same test
#             source built against main before the change (.data/ba/base/)
#   var       each A/B build .data/ba/var-*/ (an uncommitted variant of the new kernel): its
#             quick tier (correctness) and its times
#   bench     kvsieve bench --batch 1,4,16,64 --ttft-under-load at 4K with the new build, then
#             main's build before this session (.data/base/kvsieve.xz: base_bench), same card
#   memcheck  compute-sanitizer memcheck of the test's quick tier
#   ncu       the new kernel's own time (ncu, no clock control) at B = 1, 4, 16, 64 x 4096:
#             launches 16-65 of the --time-only run
# .data/ba/{new,base,var-*}/ hold stripped xz'd kvsieve and test_attn_decode_batch (carried; a
# step whose binary is not there says so and goes on).
# At most 7 files come back: card, test, test_base, var, bench, memcheck, ncu (.txt).
# Usage (repository root, GPU machine): bash bench/gpu_ba.sh [step ...]
T0=$(date +%s); DEADLINE=${DEADLINE:-170}
O=${OUT:-/tmp}/ba; mkdir -p $O
S=.data/ba; R=$(mktemp -d)
for d in $S/*/; do
    n=$(basename $d); mkdir -p $R/$n
    for f in $d*.xz; do [ -f $f ] && xz -dc $f > $R/$n/$(basename $f .xz) && chmod +x $R/$n/$(basename $f .xz); done
done
mkdir -p $R/base; [ -f .data/base/kvsieve.xz ] && xz -dc .data/base/kvsieve.xz > $R/base/kvsieve && chmod +x $R/base/kvsieve
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0 LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH PATH=$PATH:/usr/local/cuda/bin
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader > $O/card.txt 2>&1
C="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --lengths 4096 --gen 32"
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
run() { # run LIMIT CMD...: at most LIMIT seconds and never past the deadline
    local l=$1 r; shift; r=$(left); [ $r -lt $l ] && l=$r
    if [ $l -lt 5 ]; then echo "skipped: $(left) s left"; return; fi
    timeout $l "$@" 2>&1; echo "rc=$? ($(( $(date +%s) - T0 )) s into the call)"
}
step_test() { run 60 $R/new/test_attn_decode_batch > $O/test.txt; }
step_base() { run 30 $R/base/test_attn_decode_batch --time-only > $O/test_base.txt; }
step_var() {
    for d in $R/var-*/; do [ -d $d ] || continue
        { echo "== $(basename $d)"; run 15 $d/test_attn_decode_batch --quick; run 25 $d/test_attn_decode_batch --time-only; } >> $O/var.txt
    done
}
step_bench() {
    { echo "== new"; run 40 $R/new/kvsieve $C --batch 1,4,16,64 --ttft-under-load
      echo "== base"; run 40 $R/base/kvsieve $C --batch 1,4,16,64 --ttft-under-load; } > $O/bench.txt
}
step_memcheck() {
    run 40 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_attn_decode_batch --quick > $O/memcheck.txt
}
step_ncu() { # --time-only's launches 0-20 are B = 1, 21-41 B = 4, 42-62 B = 16, 63-83 B = 64: the kernel alone
    command -v ncu > /dev/null || { echo "no ncu" > $O/ncu.txt; return; }
    run 60 ncu --clock-control none -k regex:adb_ --launch-skip 16 --launch-count 50 \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum.per_second,launch__grid_size \
        $R/new/test_attn_decode_batch --time-only 2>&1 | grep -E "gpu__time|dram__|launch__grid|rc=|==ERR" > $O/ncu.txt
}
for s in ${*:-test base bench memcheck var ncu}; do echo "== step $s at $(( $(date +%s) - T0 )) s"; step_$s || true; done
rm -rf $R
cat $O/card.txt; tail -n 25 $O/test.txt $O/test_base.txt $O/var.txt $O/bench.txt $O/memcheck.txt $O/ncu.txt 2>/dev/null
true
