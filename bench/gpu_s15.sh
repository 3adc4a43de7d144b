# Session 15's device calls (GPU 0): the split-K narrow GEMMs of the batched step (issue 16) and
# whatever else the session measures. Binaries from .data/s15/*.xz (carry .data/s15 and, for the
# tests, .data/stories260K); each step writes one file under $OUT/s15/ (the tool returns <= 8).
#   gemm    test_gemm_rows (correctness, then --bench: per op at 1/4/16/64 rows: convert + cuBLAS,
#           cuBLAS alone, cuBLAS over 2/4/8 K slices + the sum, the skinny kernel) and test_cuda's
#           matmul and splitk_sum groups
#   b16     issue 16's batched decode at 4K, B = 1, 4, 16, 64 with TTFT under load: the same binary
#           with KS_CUDA_GEMM_SPLITS=1 (no split: main's path), automatic, and 4; twice, alternated
# Usage: bash bench/gpu_s15.sh STEP...
S=.data/s15; R=$(mktemp -d); O="$OUT/s15"; mkdir -p $O
for f in $S/*.xz; do [ -f $f ] && xz -dc $f > $R/$(basename $f .xz); done
chmod +x $R/* 2>/dev/null
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} KS_STORIES=.data/stories260K
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/card.txt
step_gemm() {
    ( timeout 250 $R/test_gemm_rows --bench 2>&1 | grep -v "^  ok"
      timeout 100 $R/test_cuda --only matmul 2>&1 | tail -4
      timeout 100 $R/test_cuda --only splitk_sum 2>&1 | tail -12 ) > $O/gemm.txt
}
step_b16() {
    for r in 1 2; do for sp in 1 0 4; do echo "== GEMM_SPLITS=$sp (round $r)"
        KS_CUDA_GEMM_SPLITS=$sp timeout 200 $R/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda \
            --lengths 4096 --gen 32 --batch 1,4,16,64 --ttft-under-load 2>&1 | grep -E "^tokens|^4096|kvsieve:"
    done; done > $O/b16.txt
}
for s in "$@"; do echo "== step $s $(date +%T)"; step_$s; done
rm -rf $R
