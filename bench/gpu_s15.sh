# Session 15's device calls (GPU 0): the split-K narrow GEMMs of the batched step (issue 16) and
# the decode steps in graph segments (issue 14). Binaries from .data/s15/*.xz (S15=DIR: another
# folder; carry it and, for the tests, .data/stories260K); each step writes one file under
# $OUT/s15/ (the tool returns <= 8).
#   gemm    test_gemm_rows (correctness, then --bench: per op at 1/4/16/64 rows: convert + cuBLAS,
#           cuBLAS alone, the skinny kernel; the split-K build of bench/NOTES.md "Split K" also
#           had cuBLAS over 2/4/8 K slices + a sum) and test_cuda's matmul group
#   b16     issue 16's batched decode at 4K, B = 1, 4, 16, 64 with TTFT under load
#   tests   whichever test binaries were carried: test_cuda_policies (with stories260K), test_cuda --quick,
#           test_gemm_rows, test_cuda_prims, test_attn_decode_batch, test_attn_list
#   b14     issue 14's 32K row, this build beside main before session 14 (.data/base, 2ac0e46, with its
#           policy files .data/f14/basepol): full, the no-op handler, TokenSelect, Quest
# Usage: bash bench/gpu_s15.sh STEP...
S=${S15:-.data/s15}; R=$(mktemp -d); O="$OUT/s15"; mkdir -p $O
for f in $S/*.xz; do [ -f $f ] && xz -dc $f > $R/$(basename $f .xz); done
chmod +x $R/* 2>/dev/null
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} KS_STORIES=.data/stories260K
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/card.txt
step_gemm() {
    ( timeout 250 $R/test_gemm_rows --bench 2>&1 | grep -v "^  ok"
      timeout 100 $R/test_cuda --only matmul 2>&1 | tail -4
      ) > $O/gemm.txt
}
step_b16() { # (the split-K build ran this with KS_CUDA_GEMM_SPLITS=1 and =0, a switch removed since)
    timeout 200 $R/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda \
        --lengths 4096 --gen 32 --batch 1,4,16,64 --ttft-under-load 2>&1 | grep -E "^tokens|^4096|kvsieve:" > $O/b16.txt
}
tst() { # tst BINARY ARGS...: its failures and summary, when it was carried
    [ -x $R/$1 ] || return 0
    echo "== $*"; local b=$1; shift
    timeout 200 $R/$b "$@" 2>&1 | grep -v "^  ok" | tail -12
}
step_tests() {
    ( tst test_cuda_policies --stories .data/stories260K; tst test_cuda --quick; tst test_gemm_rows
      tst test_cuda_prims; tst test_attn_decode_batch; tst test_attn_list --quick ) >> $O/tests.txt
}
step_memcheck() { # compute-sanitizer over the segment cases (staged lists, recorded attention) and the list kernels
    ( [ -x $R/test_cuda_policies ] && timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 \
          $R/test_cuda_policies --only "decode handler" 2>&1 | tail -4
      [ -x $R/test_attn_list ] && timeout 200 compute-sanitizer --tool memcheck --error-exitcode 1 \
          $R/test_attn_list --quick 2>&1 | tail -3 ) >> $O/memcheck.txt
}
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
row() { # row TAG ARGS...: base (its policy files) then this build
    local t=$1; shift
    if [ -f .data/base/kvsieve.xz ]; then
        xz -dc .data/base/kvsieve.xz > $R/base-kvsieve; chmod +x $R/base-kvsieve
        KVSIEVE_POLICY_PATH=.data/f14/basepol timeout 200 $R/base-kvsieve $B "$@" 2>&1 |
            grep -E "^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:" | sed "s/^/$t base: /"
    fi
    timeout 200 $R/kvsieve $B "$@" 2>&1 | grep -E "^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:" | sed "s/^/$t new: /"
}
step_b14() {
    ( row 32K --lengths 32768 --gen 32 --policy none,noop,tokenselect,quest ) >> $O/b14.txt
}
step_b14l() { # the rest of issue 14's table: the hit path at 32K, 128K (none, TokenSelect, its hit path, Quest)
    ( row 32K-hit --lengths 32768 --gen 32 --policy tokenselect --set tokenselect.cache_theta=-1
      row 128K --lengths 131040 --gen 16 --policy none,tokenselect,quest
      row 128K-hit --lengths 131040 --gen 16 --policy tokenselect --set tokenselect.cache_theta=-1 ) >> $O/b14.txt
}
for s in "$@"; do echo "== step $s $(date +%T)"; step_$s; done
rm -rf $R
