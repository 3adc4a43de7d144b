# Session 18's device calls (GPU 0). Binaries from one xz'd tar (PK=FILE, default .data/s18/pk.tar.xz):
# base/ (main before the session, a49e25e), new/ (the build under test) and any other build directory
# named in V (default "base new"; the timing steps run each in turn); carry it and, for the policy
# tests, .data/stories260K. Each step writes one file under $OUT/s18/.
#   tests    new: test_attn_list (all cases), test_cuda_policies, test_cuda --quick, test_gemm_rows,
#            test_attn_decode_batch --quick
#   tests1   test_attn_list, test_cuda_policies, test_cuda --quick --only attention
#   ab       32K, 64 steps: full, TokenSelect, its hit path; each build of $V, three rounds
#   final    issue 14's table (8K / 32K / 128K rows of every policy it names), each build of $V
#   hitx     128K: full and the hit path (--gen 32), each build of $V: more rounds of the ratio
#   reg      full at 8K and FastKV at 128K (--gen 32), three rounds of each build of $V
#   quest    Quest (budget 4096) and full at 128K, each build of $V
#   ncu      the list attention's kernels (rope table, no rotation, combine) under ncu, one launch each
#   memcheck compute-sanitizer over new test_attn_list --quick and test_cuda_prims --quick
#   prims    new test_cuda_prims (every primitive against its CPU twin)
#   attn     test_attn_list --bench (one layer's list attention, 2688 rows of 32K / 128K): base, new
#   hit32    TokenSelect's hit path (cache_theta -1) and full attention at 32K
#   hit      TokenSelect's hit path (cache_theta -1) and full attention, 32K and 128K: base then new
#   ts       TokenSelect (defaults) and full attention at 32K: base then new
#   ts128    TokenSelect and Quest (budget 4096) and full attention at 128K: base then new
#   prof     the per-phase decode profile of the hit path at 32K: each build of $V
#   profts   the same for TokenSelect's defaults
# Usage: bash bench/gpu_s18.sh STEP...
TAG=s18; PK=${PK:-.data/s18/pk.tar.xz}
. bench/gpu_pack_env.sh
step_tests() {
    ( tst test_attn_list; tst test_cuda_policies --stories .data/stories260K; tst test_cuda --quick
      tst test_gemm_rows; tst test_attn_decode_batch --quick ) >> $O/tests.txt
}
step_tests1() { # the attention and policy tests alone
    ( tst test_attn_list; tst test_cuda_policies --stories .data/stories260K; tst test_cuda --quick --only attention ) >> $O/tests.txt
}
step_ab() { # 32K, 64 steps: full, TokenSelect and its hit path, each build of $V in turn, three rounds
    for r in 1 2 3; do
        row 32K-g64 --lengths 32768 --gen 64 --policy none,tokenselect
        row 32K-g64-hit --lengths 32768 --gen 64 --policy tokenselect --set tokenselect.cache_theta=-1
    done >> $O/ab.txt
}
step_final() { # issue 14's table: every row base then new (each build with its own policy files)
    ( row 8K --lengths 8192 --gen 8 --policy none
      row 32K --lengths 32768 --gen 32 --policy none,noop,tokenselect,quest --set quest.budget=4096
      row 32K-hit --lengths 32768 --gen 32 --policy tokenselect --set tokenselect.cache_theta=-1
      row 32K-sllm-static --lengths 32768 --gen 32 --policy streamingllm --set budget=2048
      row 32K-sllm-rolling --lengths 32768 --gen 32 --policy streamingllm --set budget=2048 --set rolling=true
      row 128K --lengths 131040 --gen 16 --policy none,tokenselect,quest,gemfilter,fastkv --set quest.budget=4096
      row 128K-hit --lengths 131040 --gen 32 --policy none,tokenselect --set tokenselect.cache_theta=-1 ) >> $O/final.txt
}
step_hitx() { # 128K: full and TokenSelect's hit path again, each build of $V (more rounds of the ratio)
    row 128K-hit --lengths 131040 --gen 32 --policy none,tokenselect --set tokenselect.cache_theta=-1 >> $O/hitx.txt
}
step_reg() { # the no-regression rows that moved in the final call, three rounds of each build of $V
    for r in 1 2 3; do
        row 8K --lengths 8192 --gen 32 --policy none
        row 128K-fastkv --lengths 131040 --gen 32 --policy fastkv
    done >> $O/reg.txt
}
step_quest() { # Quest (budget 4096) and full at 128K, each build of $V
    row 128K-quest --lengths 131040 --gen 16 --policy none,quest --set quest.budget=4096 >> $O/quest.txt
}
step_ncu() { # the list attention's kernels under ncu, one launch each, from test_attn_list --bench-only
    for k in attn_decode_tc_kernelILi128ELi2E attn_decode_tc_kernelILi128ELi0E attn_combine_kernel; do
        echo "== $k"
        timeout 200 ncu --clock-control none --kernel-name-base mangled -k regex:$k --launch-skip 30 --launch-count 1 \
            --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
            --section SchedulerStats --section MemoryWorkloadAnalysis $R/new/test_attn_list --bench-only 2>&1 |
            grep -v "^  time\|^==PROF==\|^  ok"
    done > $O/ncu.txt
}
step_memcheck() {
    ( timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_attn_list --quick 2>&1 | tail -3
      [ -x $R/new/test_cuda_prims ] && timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 \
          $R/new/test_cuda_prims --quick 2>&1 | tail -3 ) >> $O/memcheck.txt
}
step_prims() { tst test_cuda_prims >> $O/tests.txt; }
V=${V:-base new} # the builds the timing steps run, in order (directories of the pack)
step_attn() {
    for v in $V; do echo "== $v"; timeout 250 $R/$v/test_attn_list --bench 2>&1 | grep "time bench"; done >> $O/attn.txt
}
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
row() { # row TAG ARGS...: each build of $V
    local t=$1; shift
    for v in $V; do # a build older than today's policy files runs its own (R/<build>/policies, searched first)
        KVSIEVE_POLICY_PATH=$R/$v/policies timeout 250 $R/$v/kvsieve $B "$@" 2>&1 |
            grep -E "^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:" | sed "s/^/$t $v: /"
    done
}
step_hit32() { row 32K-hit --lengths 32768 --gen 32 --policy none,tokenselect --set tokenselect.cache_theta=-1 >> $O/b14.txt; }
step_hit() {
    ( row 32K-hit --lengths 32768 --gen 32 --policy none,tokenselect --set tokenselect.cache_theta=-1
      row 128K-hit --lengths 131040 --gen 32 --policy none,tokenselect --set tokenselect.cache_theta=-1 ) >> $O/b14.txt
}
step_ts() { row 32K --lengths 32768 --gen 32 --policy none,tokenselect >> $O/b14.txt; }
step_ts128() { row 128K --lengths 131040 --gen 16 --policy none,tokenselect,quest --set quest.budget=4096 >> $O/b14.txt; }
step_prof() {
    for v in $V; do echo "== $v hit path 32K"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 250 $R/$v/kvsieve $B --lengths 32768 --gen 16 --policy tokenselect \
        --set tokenselect.cache_theta=-1 --profile 2>&1 | sed -n '/^profile/,/^rates/p'; done >> $O/prof.txt 2>&1
}
step_profts() {
    for v in $V; do echo "== $v TokenSelect 32K"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 250 $R/$v/kvsieve $B --lengths 32768 --gen 16 --policy tokenselect \
        --profile 2>&1 | sed -n '/^profile/,/^rates/p'; done >> $O/prof.txt 2>&1
}
for s in "$@"; do echo "== step $s $(date +%T)"; step_$s; done
rm -rf $R
