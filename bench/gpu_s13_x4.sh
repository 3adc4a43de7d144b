# Session 13's last device call, on a 4-GPU machine (kind nvidia-h100-x4, listed late in the
# session): issue 16's batched decode on GPU 0 (the final build: the tile attention kernel and
# greedy ids on the device) and issue 17's four-rank runs (test_tp_cuda with its four_ranks cases,
# kvsieve bench --tp 1 / 4 at 128K and 32K on the Llama-3.1-8B shape). Steps run while the call's
# wall time is under DEADLINE seconds (default 190), most important first.
# Carry .data/fin (kvsieve.xz, test_attn_decode_batch.xz, test_tp_cuda.xz) and .data/stories260K.
T0=$(date +%s); DEADLINE=${DEADLINE:-190}
S=.data/fin; R=$(mktemp -d)
for f in $S/*.xz; do xz -dc $f > $R/$(basename $f .xz); done
chmod +x $R/*
export NCCL_NVLS_ENABLE=0 KS_STORIES=.data/stories260K
mkdir -p $OUT/b16 $OUT/tp
( nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 ) > $OUT/card.txt
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
run() { # run LIMIT CMD...: at most LIMIT seconds and never past the deadline
    local l=$1 r; shift; r=$(left); [ $r -lt $l ] && l=$r
    if [ $l -lt 5 ]; then echo "skipped: $(left) s left"; return; fi
    timeout $l "$@" 2>&1; echo "rc=$? ($(( $(date +%s) - T0 )) s into the call)"
}
B8="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda"
CUDA_VISIBLE_DEVICES=0 run 25 $R/test_attn_decode_batch > $OUT/b16/test.txt
run 40 $R/test_tp_cuda --stories .data/stories260K > $OUT/tp/test.txt
CUDA_VISIBLE_DEVICES=0 run 45 $R/kvsieve $B8 --lengths 4096 --gen 32 --batch 1,4,16,64 --ttft-under-load > $OUT/b16/bench.txt
( for tp in 1 4; do echo "== 128K tp $tp"; run 40 $R/kvsieve $B8 --repeat 1 --lengths 131040 --gen 16 --tp $tp; done
  for tp in 1 4; do echo "== 32K tp $tp"; run 20 $R/kvsieve $B8 --repeat 1 --lengths 32768 --gen 16 --tp $tp; done ) > $OUT/tp/bench.txt
CUDA_VISIBLE_DEVICES=0 run 20 compute-sanitizer --tool memcheck --error-exitcode 1 $R/test_attn_decode_batch --quick | tail -4 > $OUT/b16/memcheck.txt
CUDA_VISIBLE_DEVICES=0 run 15 $R/kvsieve $B8 --lengths 4096 --gen 32 --batch 64 --host-argmax > $OUT/b16/host.txt
rm -rf $R
echo "done at $(( $(date +%s) - T0 )) s"
