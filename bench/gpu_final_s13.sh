# Session 13's closing GPU check, in one device call (GPU 0 of the machine): the CUDA tests of the
# final build (.data/s13f/new), compute-sanitizer on the primitives' quick tier, and `kvsieve
# bench` at 32K of session 12's final build (.data/s13f/base) beside the final one for full,
# gemfilter and fastkv (no regression), plus TokenSelect and Quest on the final build.
# Carry .data/s13f and .data/stories260K. Usage: bash bench/gpu_final_s13.sh [tests] [memcheck] [bench] [serve] [stall]
# (serve: bench/serve_smoke.py, 8 concurrent requests with mixed policies on the CUDA build)
S=.data/s13f; R=$(mktemp -d); mkdir -p $R/base $R/new
for f in $S/base/*.xz; do xz -dc $f > $R/base/$(basename $f .xz); done
for f in $S/new/*.xz; do xz -dc $f > $R/new/$(basename $f .xz); done
chmod +x $R/*/*
export KS_STORIES=.data/stories260K NCCL_NVLS_ENABLE=0
N=$R/new
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/card.txt
step_tests() {
    ( timeout 120 $N/test_cuda --quick 2>&1 | grep -v "^  ok" | tail -8
      timeout 90 $N/test_cuda_prims 2>&1 | grep -v "^  ok" | tail -4
      timeout 90 $N/test_cuda_policies --stories .data/stories260K 2>&1 | tail -3 ) > $OUT/tests.txt
}
step_memcheck() {
    timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 $N/test_cuda_prims --quick 2>&1 | tail -4 > $OUT/memcheck.txt
    echo "rc=${PIPESTATUS[0]}" >> $OUT/memcheck.txt
}
step_bench() {
    B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --lengths 32768 --gen 32 --repeat 1"
    ( for v in base new; do echo "== $v"; timeout 100 $R/$v/kvsieve $B --policy none,gemfilter,fastkv 2>&1 | grep -E "^(none|gemfilter|fastkv) "; done
      echo "== new decode-time"; timeout 120 $N/kvsieve $B --policy tokenselect,quest --set quest.budget=4096 2>&1 | grep -E "^(tokenselect|quest) "
    ) > $OUT/bench.txt
}
step_serve() {
    timeout 120 python3 bench/serve_smoke.py $N/kvsieve --backend cuda --n 8 > $OUT/serve.txt 2>&1
    echo "rc=$?" >> $OUT/serve.txt
}
step_stall() { # why the one-row logits kernel runs at ~1.6 TB/s: its warps' stall reasons (for the next session)
    timeout 90 ncu --clock-control none -k regex:sc1_logits --launch-count 1 \
        --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,lts__t_sectors_srcunit_tex_op_read.sum \
        $N/bench_kernels --select 2>&1 | grep -E "stalled|dram__|warps_active|bank|lts__" | awk '$NF+0 > 0.05' > $OUT/stall.txt
}
for s in ${*:-tests memcheck bench serve stall}; do echo "== step $s $(date +%T)"; step_$s; done
rm -rf $R
tail -n 20 $OUT/*.txt
