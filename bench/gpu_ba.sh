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
#   ncu       the new kernel's DRAM throughput and warp stall reasons at B = 64 x 4096 (one
#             launch of the --time-only run, ncu without clock control)
# .data/ba/{new,base,var-*}/ hold stripped xz'd kvsieve and test_attn_decode_batch (carried; a
# step whose binary is not there says so and goes on).
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
    for d in $R/var-*/; do [ -d $d ] || continue; n=$(basename $d)
        { run 15 $d/test_attn_decode_batch --quick; run 25 $d/test_attn_decode_batch --time-only; } > $O/$n.txt
    done
}
step_bench() {
    run 40 $R/new/kvsieve $C --batch 1,4,16,64 --ttft-under-load --json $O/bench.json > $O/bench.txt
    run 40 $R/base/kvsieve $C --batch 1,4,16,64 --ttft-under-load --json $O/base_bench.json > $O/base_bench.txt
}
step_memcheck() {
    run 40 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_attn_decode_batch --quick > $O/memcheck_full.txt
    tail -6 $O/memcheck_full.txt > $O/memcheck.txt
}
step_ncu() { # launches 1-63 of --time-only are B = 1, 4, 16 (21 each): the 6th of B = 64
    command -v ncu > /dev/null || { echo "no ncu" > $O/ncu.txt; return; }
    run 90 ncu --clock-control none -k regex:adb_kernel --launch-skip 68 --launch-count 1 \
        --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum.per_second,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,gpu__time_duration.sum,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem \
        $R/new/test_attn_decode_batch --time-only 2>&1 | grep -E "stalled|dram__|warps_active|bank|gpu__time|launch__|rc=|==ERR|adb_kernel" > $O/ncu.txt
}
for s in ${*:-test base bench memcheck var ncu}; do echo "== step $s at $(( $(date +%s) - T0 )) s"; step_$s || true; done
rm -rf $R
cat $O/card.txt; tail -n 25 $O/test.txt $O/test_base.txt $O/var-*.txt $O/bench.txt $O/base_bench.txt $O/memcheck.txt 2>/dev/null
true
