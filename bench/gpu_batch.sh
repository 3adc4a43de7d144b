# Issue 16's GPU figures in one device call (kind nvidia-h100-x2, GPU 0), with a deadline: each
# step runs only while the call's wall time is under its limit (DEADLINE seconds, default 84),
# so the outputs come back before the call's own limit. Steps (in this order):
#   test    test_attn_decode_batch: the batched-attention kernel and the greedy ids kernel
#           against their CPU twins, then their times at the 8B shape (one layer, B = 16 and 64 x
#           4096 keys: the kernel | per session; argmax of 64 x 128256 beside 64 row downloads)
#   memcheck compute-sanitizer memcheck of the test's quick tier
#   bench   kvsieve bench --batch 1,4,16,64 --ttft-under-load at 4K (the device argmax)
#   old     the same B = 64 row with the build before this work (.data/b2/old/kvsieve.xz: host
#           argmax over downloaded logits, the stream kernel) on the same card
#   host    the new build's B = 64 row with --host-argmax (the argmax A/B)
#   stream  the B = 64 row of an A/B build (.data/b2/stream/kvsieve.xz; an attention kernel
#           variant built from an uncommitted change, when one is being compared)
#   ab      B = 16, 64 with --attn-per-session (the per-session attention path)
#   short   B = 1, 4, 16, 64 at 128 tokens (the step without KV)
# Carry .data/b2 (stripped, xz'd: kvsieve.xz, test_attn_decode_batch.xz[, old/kvsieve.xz,
# stream/kvsieve.xz]).
# Usage: bash bench/gpu_batch.sh [step ...]   (test bench old host stream memcheck when none)
T0=$(date +%s); DEADLINE=${DEADLINE:-84}
S=.data/b2; R=$(mktemp -d); mkdir -p $R/old $R/stream
for f in $S/*.xz; do xz -dc $f > $R/$(basename $f .xz); done
for d in old stream; do for f in $S/$d/*.xz; do [ -f $f ] && xz -dc $f > $R/$d/$(basename $f .xz); done; done
chmod +x $R/* $R/old/* $R/stream/* 2>/dev/null
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/card.txt
C="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --lengths 4096 --gen 32"
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
run() { # run LIMIT CMD...: at most LIMIT seconds and never past the deadline
    local l=$1 r; shift; r=$(left); [ $r -lt $l ] && l=$r
    if [ $l -lt 5 ]; then echo "skipped: $(left) s left"; return; fi
    timeout $l "$@" 2>&1; echo "rc=$? ($(( $(date +%s) - T0 )) s into the call)"
}
step_test() { run 30 $R/test_attn_decode_batch > $OUT/test.txt; }
step_memcheck() {
    run 20 compute-sanitizer --tool memcheck --error-exitcode 1 $R/test_attn_decode_batch --quick | tail -5 > $OUT/memcheck.txt
}
step_bench() { run 40 $R/kvsieve $C --batch 1,4,16,64 --ttft-under-load --json $OUT/bench_batch.json > $OUT/bench.txt; }
step_old() { run 15 $R/old/kvsieve $C --batch 64 > $OUT/bench_old.txt; }
step_stream() { run 15 $R/stream/kvsieve $C --batch 64 > $OUT/bench_stream.txt; }
step_host() { run 15 $R/kvsieve $C --batch 64 --host-argmax > $OUT/bench_host.txt; }
step_ab() { run 30 $R/kvsieve $C --batch 16,64 --attn-per-session > $OUT/bench_ab.txt; }
step_short() { run 20 $R/kvsieve ${C/4096/128} --batch 1,4,16,64 > $OUT/bench_short.txt; }
for s in ${*:-test bench old host stream memcheck}; do echo "== step $s at $(( $(date +%s) - T0 )) s"; step_$s; done
rm -rf $R
cat $OUT/card.txt; tail -n 30 $OUT/test.txt $OUT/memcheck.txt $OUT/bench*.txt 2>/dev/null
