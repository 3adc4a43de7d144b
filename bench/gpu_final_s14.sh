# Session 14's closing GPU check (GPU 0), main's final build (.data/f14/new) beside main from before
# the session (.data/base/kvsieve.xz, 2ac0e46). Each part fits one device call (the tool carries
# ~6.5 MB of binaries and returns at most 8 files: each step writes one file under $OUT/f14/).
#   tests      whichever test binaries were carried: test_cuda --quick, test_cuda_prims (and its memcheck),
#              test_cuda_policies, test_attn_decode_batch, test_gemm_rows, test_attn_list (three calls:
#              .data/f14/tests, .data/f14/testsB, .data/f14/tests2, each with .data/stories260K)
#   b14        issue 14's table, base and new alternated per row: full / TokenSelect (default and the hit
#              path, cache_theta = -1) / Quest (page 16, budget 4096) / the no-op handler at 32K; full,
#              TokenSelect, Quest, GemFilter and FastKV at 128K; full at 8K; StreamingLLM with a 2K budget,
#              static and rolling, at 32K (carry .data/f14/new/kvsieve.xz, .data/f14/basepol, .data/base)
#   prof       --profile of TokenSelect's hit path and of Quest at 32K (new build)
#   b16        issue 16's batched decode at 4K, B = 1, 4, 16, 64, TTFT under load, base and new
# Usage: bash bench/gpu_final_s14.sh STEP...
S=.data/f14; R=$(mktemp -d); O="$OUT/f14"; mkdir -p $R/base $R/new $O
[ -f .data/base/kvsieve.xz ] && xz -dc .data/base/kvsieve.xz > $R/base/kvsieve
for f in $S/*/*.xz; do [ -f $f ] && xz -dc $f > $R/new/$(basename $f .xz); done
chmod +x $R/*/* 2>/dev/null
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} KS_STORIES=.data/stories260K
N=$R/new
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/card.txt
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
row() { # row TAG ARGS...: base (with the policy files of its commit, .data/f14/basepol) then new
    local t=$1; shift
    KVSIEVE_POLICY_PATH=.data/f14/basepol timeout 200 $R/base/kvsieve $B "$@" 2>&1 |
        grep -E "^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:" | sed "s/^/$t base: /"
    timeout 200 $N/kvsieve $B "$@" 2>&1 | grep -E "^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:" | sed "s/^/$t new: /"
}
tst() { # tst BINARY ARGS...: its failures and summary, when it was carried
    [ -x $N/$1 ] || return 0
    echo "== $*"; local b=$1; shift
    timeout 150 $N/$b "$@" 2>&1 | grep -v "^  ok" | tail -8
}
step_tests() { # one call each: .data/f14/tests, then testsB, then tests2 (the tool carries ~6.5 MB)
    ( tst test_cuda --quick; tst test_cuda_prims
      tst test_cuda_policies --stories .data/stories260K; tst test_attn_decode_batch
      tst test_gemm_rows; tst test_attn_list
      [ -x $N/test_cuda_prims ] && timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 $N/test_cuda_prims --quick 2>&1 | tail -3
    ) >> $O/tests.txt
}
step_b14() {
    ( row 32K --lengths 32768 --gen 32 --policy none,tokenselect,quest,noop
      row 32K-hit --lengths 32768 --gen 32 --policy tokenselect --set tokenselect.cache_theta=-1
      row 32K-stream-static --lengths 32768 --gen 32 --policy streamingllm --set streamingllm.budget=2048
      row 32K-stream-rolling --lengths 32768 --gen 32 --policy streamingllm --set streamingllm.budget=2048 --set streamingllm.rolling=true
      row 8K --lengths 8192 --gen 32 --policy none
      row 128K --lengths 131040 --gen 16 --policy none,tokenselect,quest,gemfilter,fastkv
      row 128K-hit --lengths 131040 --gen 16 --policy tokenselect --set tokenselect.cache_theta=-1 ) > $O/b14.txt
}
step_prof() { # where a TokenSelect hit-path step and a Quest step go (new build, 32K; plain launches)
    ( timeout 120 $N/kvsieve $B --lengths 32768 --gen 16 --policy tokenselect --set tokenselect.cache_theta=-1 --profile 2>&1 | tail -30
      timeout 120 $N/kvsieve $B --lengths 32768 --gen 16 --policy quest --profile 2>&1 | tail -30 ) > $O/prof.txt
}
step_b16() {
    for v in base new; do echo "== $v"
        timeout 200 $R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --lengths 4096 \
            --gen 32 --batch 1,4,16,64 --ttft-under-load 2>&1 | grep -E "^tokens|^4096|kvsieve:"
    done > $O/b16.txt
}
for s in "$@"; do echo "== step $s $(date +%T)"; step_$s; done
rm -rf $R
tail -n 40 $O/*.txt
