# Issue 14's rolling StreamingLLM on a KV ring, on GPU 0 of the device call, under a deadline
# (DEADLINE seconds, default 220; each step runs only while time is left). Outputs: $OUT/ring/
# card.txt, test.txt and bench.txt (each step appends under a "==" header). Steps, in order:
#   test     test_cuda_policies --only ring: the ring's decode replayed as the graph against the
#            same requests launched one by one (graphs off), teacher-forced: logits against a
#            control (static StreamingLLM graph vs plain), kept rows, graph steps; the compacting
#            path beside (informational)
#   bench    kvsieve bench at 32K, gen 32, 8B shape (random weights): streamingllm budget 2048
#            static and rolling, with this build and with the build before the ring (the base:
#            .data/ring/base/kvsieve.xz with the policy file of its commit,
#            .data/ring/base/streamingllm.lua), alternated so that drift hits both alike
#   pol      test_cuda_policies --quick --only streamingllm: the policy's other CUDA cases
#   long     the rolling row at --gen 2100 (the ring wraps once: one re-recording) and the
#            rolling row with --profile (per-phase times of a step)
#   memcheck compute-sanitizer memcheck of the first ring case
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
# (the device tool returns at most 8 files: three here, each step appending with a header)
step_test() { echo "== test_cuda_policies --only ring" >> $O/test.txt; run 60 $R/test_cuda_policies --only ring >> $O/test.txt; }
step_bench() {
    for i in 1 2; do
        for b in new base; do
            K=$R/kvsieve; P=streamingllm
            [ $b = base ] && { K=$R/base/kvsieve; P=$S/base/streamingllm.lua; }
            echo "== $b static (run $i)" >> $O/bench.txt
            run 30 $K $C --policy $P --set budget=2048 >> $O/bench.txt
            echo "== $b rolling (run $i)" >> $O/bench.txt
            run 30 $K $C --policy $P --set budget=2048 --set rolling=true >> $O/bench.txt
        done
    done
}
step_pol() { echo "== test_cuda_policies --quick --only streamingllm" >> $O/test.txt; run 40 $R/test_cuda_policies --quick --only streamingllm >> $O/test.txt; }
step_long() {
    echo "== new rolling, --gen 2100 (the ring wraps once)" >> $O/bench.txt
    run 40 $R/kvsieve ${C/--gen 32/--gen 2100} --policy streamingllm --set budget=2048 --set rolling=true >> $O/bench.txt
    echo "== new rolling, --profile" >> $O/bench.txt
    run 30 $R/kvsieve $C --policy streamingllm --set budget=2048 --set rolling=true --profile >> $O/bench.txt
}
step_memcheck() {
    echo "== memcheck: test_cuda_policies --only 'ring budget=48'" >> $O/test.txt
    run 90 compute-sanitizer --tool memcheck --error-exitcode 1 $R/test_cuda_policies --only "ring budget=48" 2>&1 | tail -5 >> $O/test.txt
}
for s in ${*:-test bench pol long memcheck}; do echo "== step $s at $(( $(date +%s) - T0 )) s"; step_$s; done
rm -rf $R
cat $O/card.txt; cat $O/test.txt
grep -E "^==|^streamingllm|^\.data" $O/bench.txt
true
