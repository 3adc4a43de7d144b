# Session 14 (coordinator): the one-launch top-k (kernels/prim_topk.cu) and the page primitives
# (kernels/prim_page.cu) on the GPU: their tests against the CPU, the selection kernels' times
# (bench_kernels --select / --quest, the build before the change as bk_old beside the new one),
# and TokenSelect / Quest TPOT beside main's binary from before (.data/base) in the same call.
# Carry .data/co (tests, kern) and .data/co2 + .data/base (b32, b128), .data/stories260K (tests).
# Usage: bash bench/gpu_co.sh [tests] [kern] [ncu] [ncutopk] [ncuscores] [pol] [b32] [b128]
R=$(mktemp -d); mkdir -p $R/base $R/new "$OUT/co"
[ -f .data/base/kvsieve.xz ] && xz -dc .data/base/kvsieve.xz > $R/base/kvsieve
for f in .data/co/*.xz .data/co2/*.xz; do [ -f $f ] && xz -dc $f > $R/new/$(basename $f .xz); done
chmod +x $R/*/*
# the policies these binaries were built with (the working tree may hold others' unfinished ones)
[ -d .data/co2/policies ] && cp .data/co2/policies/*.lua policies/
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
N=$R/new O="$OUT/co"
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/card.txt
step_tests() {
    ( timeout 100 $N/test_cuda_prims --only topk 2>&1 | grep -v "^  ok" | tail -12
      timeout 60 $N/test_cuda_prims --only page 2>&1 | grep -v "^  ok" | tail -12 ) > $O/tests.txt
}
step_ncu() { # bound_scores at 128K (the 13th launch of --quest: 3 warm-up + 15 timed at 32K, then 128K)
    for v in bk_old bench_kernels; do echo "== $v"
        timeout 90 ncu --clock-control none -k regex:bound_scores --launch-skip 20 --launch-count 1 \
            --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_shared_mem,launch__occupancy_limit_registers,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum \
            $N/$v --quest 2>&1 | grep -E "bound_scores|gpu__|dram__|sm__|launch__|stalled|inst_exec|bank|ERR"
    done > $O/ncu.txt
}
step_ncutopk() { # every kernel of one topk 2048 of 32128 and of 130432 (after 18 calls each)
    timeout 120 ncu --clock-control none -k regex:"tk_|sc1_" --launch-skip 60 --launch-count 40 \
        --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size \
        $N/bench_kernels --select 2>&1 | grep -E "^  [a-z_]+.*\(|gpu__time|grid_size|ERR" > $O/ncu_topk.txt
}
step_ncuscores() { # the one-row logits kernel at 32K: why ~1.1-1.6 TB/s (sections, one launch)
    timeout 120 ncu --clock-control none -k regex:sc1_logits --launch-skip 5 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
        --section LaunchStats --section SchedulerStats $N/bk_base2 --select > $O/ncu_scores.txt 2>&1
}
step_pol() { timeout 150 $N/test_cuda_policies --stories .data/stories260K > $O/policies.txt 2>&1; }
step_kern() {
    for v in bk_old bench_kernels bk_old bench_kernels; do echo "== $v"; timeout 60 $N/$v --quest 2>&1 | grep quest; done > $O/kern.txt
    timeout 60 $N/bench_kernels --select > $O/kern_select.txt 2>&1
}
step_b32() { # base: Quest recomputes its summaries at every step (what its "auto" did on a GPU before)
    for v in base new base new; do
        x=""; [ $v = base ] && x="--set quest.summaries=recompute"
        echo "== $v $x"; timeout 100 $R/$v/kvsieve $B --lengths 32768 --gen 32 --policy none,tokenselect,quest $x 2>&1
    done > $O/b32.txt
    echo "== new, quest.summaries=recompute" >> $O/b32.txt
    timeout 100 $N/kvsieve $B --lengths 32768 --gen 32 --policy quest --set quest.summaries=recompute >> $O/b32.txt 2>&1
}
step_b128() {
    ( echo "== base 128K, quest.summaries=recompute"
      timeout 150 $R/base/kvsieve $B --lengths 131040 --gen 16 --policy none,quest --set quest.summaries=recompute 2>&1
      echo "== new 128K"; timeout 150 $N/kvsieve $B --lengths 131040 --gen 16 --policy none,quest 2>&1
      echo "== new 128K, quest.summaries=recompute"
      timeout 150 $N/kvsieve $B --lengths 131040 --gen 16 --policy quest --set quest.summaries=recompute 2>&1 ) > $O/b128.txt
}
steps=${*:-tests kern pol b32 b128}
for s in $steps; do step_$s; done
