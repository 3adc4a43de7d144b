# Issue 14's rolling StreamingLLM on a KV ring, on GPU 0 of the device call, under a deadline
# (DEADLINE seconds, default 220; each step runs only while time is left). Outputs go to
# $OUT/ring/. Steps (in this order):
#   test     test_cuda_policies --only ring: the ring's decode replayed as the graph against the
#            same requests launched one by one (graphs off): ids, logits bit for bit, kept rows,
#            graph steps; beside it the compacting path (informational)
#   bench    kvsieve bench at 32K, gen 32, 8B shape (random weights): streamingllm budget 2048
#            static and rolling, with this build and with the build before the ring (the base:
#            .data/ring/base/kvsieve.xz with the policy file of its commit,
#            .data/ring/base/streamingllm.lua), alternated so that drift hits both alike
#   pol      test_cuda_policies --quick --only streamingllm: the policy's other CUDA cases
#   long     the rolling row at --gen 2100 (the ring wraps once: one re-recording)
#   memcheck compute-sanitizer memcheck of the ring cases
# Carry .data/ring (stripped, xz'd: kvsieve.xz, test_cuda_policies.xz, base/kvsieve.xz,
# base/streamingllm.lua).
# Usage: bash bench/gpu_ring.sh [step ...]   (all of them when none)
T0=$(date +%s); DEADLINE=${DEADLINE:-220}
S=.data/ring; R=$(mktemp -d); mkdir -p $R/base "$OUT/ring"; O="$OUT/ring"
for f in $S/*.xz; do xz -dc $f > $R/$(basename $f .xz); done
for f in $S/base/*.xz; do xz -dc $f > $R/base/$(basename $f .xz); done
chmod +x $R/* $R/base/* 2>/dev/null
export CUDA_VISIBLE_DEVICES=0 LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/card.txt
C="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 --lengths 32768 --gen 32"
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
run() { # run LIMIT CMD...: at most LIMIT seconds and never past the deadline
    local l=$1 r; shift; r=$(left); [ $r -lt $l ] && l=$r
    if [ $l -lt 5 ]; then echo "skipped: $(left) s left"; return; fi
    timeout $l "$@" 2>&1; echo "rc=$? ($(( $(date +%s) - T0 )) s into the call)"
}
step_test() { run 40 $R/test_cuda_policies --only ring > $O/test.txt; }
step_bench() {
    for i in 1 2; do
        run 30 $R/kvsieve $C --policy streamingllm --set budget=2048 > $O/bench_new_static_$i.txt
        run 30 $R/kvsieve $C --policy streamingllm --set budget=2048 --set rolling=true > $O/bench_new_rolling_$i.txt
        run 30 $R/base/kvsieve $C --policy $S/base/streamingllm.lua --set budget=2048 > $O/bench_base_static_$i.txt
        run 30 $R/base/kvsieve $C --policy $S/base/streamingllm.lua --set budget=2048 --set rolling=true > $O/bench_base_rolling_$i.txt
    done
}
step_pol() { run 40 $R/test_cuda_policies --quick --only streamingllm > $O/policies.txt; }
step_long() { run 40 $R/kvsieve ${C/--gen 32/--gen 2100} --policy streamingllm --set budget=2048 --set rolling=true > $O/bench_new_rolling_gen2100.txt; }
step_memcheck() {
    run 60 compute-sanitizer --tool memcheck --error-exitcode 1 $R/test_cuda_policies --only "ring budget=48" | tail -5 > $O/memcheck.txt
}
for s in ${*:-test bench pol long memcheck}; do echo "== step $s at $(( $(date +%s) - T0 )) s"; step_$s; done
rm -rf $R
cat $O/card.txt; tail -n 12 $O/test.txt $O/memcheck.txt $O/policies.txt 2>/dev/null
grep -H -E "TPOT|tpot|ms/tok|streamingllm" $O/bench*.txt 2>/dev/null | head -40
true
