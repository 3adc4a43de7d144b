# Session 17's device calls (GPU 0). Binaries from one xz'd tar (PK=FILE, default .data/s17/pk.tar.xz):
# base/ (main before the session, 817a319) and new/ (the build under test; A/B builds as new/kvsieve_*
# and new/test_*_* beside it); carry it and, for the policy tests, .data/stories260K. Each step writes
# one file under $OUT/s17/.
#   tests    test_cuda --quick, test_gemm_rows, test_attn_decode_batch, test_cuda_policies, test_attn_list --quick
#   memcheck compute-sanitizer over test_gemm_rows --quick, test_cuda --quick --only e2e, test_attn_decode_batch --quick
#   b16      issue 16 at 4K, B = 1, 16, 64: base/kvsieve, new/kvsieve and every new/kvsieve_* A/B build, twice
#   reg      full TTFT 8K / 32K and TPOT, B = 1, base then new
#   b14      32K: full and TokenSelect, base then new
#   b14h     128K: full and TokenSelect's hit path, base then new
#   b14l     128K: full, TokenSelect, Quest (budget 4096); 32K: TokenSelect's hit path (cache_theta -1); base then new
#   ab       new/kvsieve against new/kvsieve_prev, alternated, three rounds of 64 steps
#   prof14   issue 14: the per-phase decode profile of TokenSelect's hit path at 32K, base then new
#   adb      the batched attention: its tests, its times, its per-SM active cycles (ncu)
#   gemm     test_gemm_rows --bench (the n-row GEMMs per op)
#   host     instrumented A/B builds new/kvsieve_h* (CUDA events at each phase boundary of the batched
#            step: branch exp/phase-events-s17): the step's GPU time by phase
# Usage: bash bench/gpu_s17.sh STEP...
TAG=s17; PK=${PK:-.data/s17/pk.tar.xz}
. bench/gpu_pack_env.sh
step_tests() {
    ( tst test_cuda --quick; tst test_gemm_rows; tst test_attn_decode_batch; tst test_cuda_policies --stories .data/stories260K
      tst test_attn_list --quick ) >> $O/tests.txt
}
step_memcheck() {
    ( timeout 200 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_gemm_rows --quick 2>&1 | tail -2
      timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda --quick --only e2e 2>&1 | tail -2
      timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_attn_decode_batch --quick 2>&1 | tail -2 ) >> $O/memcheck.txt
}
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
step_b16() {
    for r in 1 2; do for v in base/kvsieve new/kvsieve $(cd $R; ls new/kvsieve_* 2>/dev/null | grep -v kvsieve_h); do
        timeout 250 $R/$v $B --lengths 4096 --gen 32 --batch 1,16,64 2>&1 |
        grep -E "^4096|kvsieve:" | sed "s|^|$v: |"; done; done >> $O/b16.txt
}
row() { # row TAG ARGS...: base then new
    local t=$1; shift
    for v in base new; do
        timeout 250 $R/$v/kvsieve $B "$@" 2>&1 | grep -E "^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:" | sed "s/^/$t $v: /"
    done
}
step_reg() { ( row 8K --lengths 8192 --gen 8 --policy none; row 32K --lengths 32768 --gen 16 --policy none ) >> $O/reg.txt; }
step_b14() { row 32K --lengths 32768 --gen 32 --policy none,tokenselect >> $O/b14.txt; }
step_b14l() { # 128K: full, TokenSelect and Quest; 32K: the hit path; base then new
    ( row 128K --lengths 131040 --gen 16 --policy none,tokenselect,quest --set quest.budget=4096
      row 32K-hit --lengths 32768 --gen 32 --policy none,tokenselect --set tokenselect.cache_theta=-1 ) >> $O/b14.txt
}
step_b14h() { row 128K-hit --lengths 131040 --gen 16 --policy none,tokenselect --set tokenselect.cache_theta=-1 >> $O/b14.txt; }
step_adb() {
    ( tst test_attn_decode_batch
      timeout 200 $R/new/test_attn_decode_batch --time-only 2>&1 | grep "time:"
      timeout 200 ncu --clock-control none -k regex:adb_kernel --launch-skip 70 --launch-count 1 \
        --metrics sm__cycles_active.min,sm__cycles_active.max,sm__cycles_active.avg,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum \
        $R/new/test_attn_decode_batch --time-only 2>&1 | grep -E "sm__|dram__|gpu__" ) > $O/adb.txt 2>&1
}
step_gemm() { timeout 300 $R/new/test_gemm_rows --bench 2>&1 | sed -n '/^device/,$p' >> $O/gemm.txt; }
step_host() {
    for v in $(cd $R; ls new/kvsieve_h* 2>/dev/null); do
        echo "== $v B=64"; timeout 250 $R/$v $B --lengths 4096 --gen 12 --batch 64 2>&1 | grep HOSTSUB | tail -4
    done > $O/host.txt
}
step_ab() { # new/kvsieve against new/kvsieve_prev (the commit before), alternated, 3 rounds, 64 steps each
    for r in 1 2 3; do for v in new/kvsieve_prev new/kvsieve; do
        timeout 250 $R/$v $B --lengths 4096 --gen 64 --batch 1,16,64 2>&1 | grep -E "^4096|kvsieve:" | sed "s|^|$v: |"
    done; done >> $O/ab.txt
}
step_prof14() { # issue 14: per-phase decode profiles (backend marks) at 32K: TokenSelect's hit path base then new, full and TokenSelect new
    for a in "base tokenselect -1" "new tokenselect -1" "new none 0" "new tokenselect 0.9"; do set -- $a
        echo "== $1 $2 theta $3"; timeout 250 $R/$1/kvsieve $B --lengths 32768 --gen 16 --policy $2 \
            --set tokenselect.cache_theta=$3 --profile 2>&1 | sed -n '/^policy /,/^rates/p'; done > $O/prof14.txt 2>&1
}
for s in "$@"; do echo "== step $s $(date +%T)"; step_$s; done
rm -rf $R
