# Sessions 19-23's device calls (GPU 0; TAG=s19, s21, s22 or s23 for those sessions, default s20). Binaries from one xz'd
# tar (PK=FILE, default .data/$TAG/pk.tar.xz): base/ (main before the session: 8176741 for s19, ac8f158 for s20, 535d81e
# for s21, 08c21a7 for s22, 834dd95 for s23), new/ (the build under test) and any other build directory
# named in V (default "base new"; the timing steps run each in turn); carry it and, for the policy
# tests, .data/stories260K. Each step writes one file under $OUT/$TAG/.
#   topk     new test_cuda_prims --only topk and its memcheck (--quick)
#   seg32    full attention and the no-op handler at 32K, each build of $V (a step in segments against one graph)
#   seg128   full, Quest, GemFilter and FastKV at 128K, each build of $V
#   alist    test_attn_list --bench-only (one layer's list attention, 2688 rows at 32K and 128K), each build of $V
#   trace    device timelines of decode steps (bench/ktrace.c, ktrace.so in the tar): TokenSelect 32K, the hit path,
#            Quest and full at 128K, each build of $V, summed by bench/ktrace.py
#   attn     new test_cuda --quick and test_attn_list --quick (the decode attention against the CPU), memcheck of test_cuda --quick
#   bound    new test_cuda_prims --only bound and --only page, memcheck of both (--quick)
#   prims    new test_cuda_prims (every primitive against its CPU twin)
#   stage    new test_cuda_prims --only stage and its memcheck (the staging launch)
#   pol      new test_cuda_policies (TokenSelect and Quest keep the CPU's sets on the GPU)
#   kq       bench_kernels --quest, each build of $V, two rounds
#   ks       bench_kernels --select, each build of $V, two rounds
#   ncut     the top-k kernels under ncu (bench_kernels --quest and --select), each build of $V
#   ncuw     why Quest's decode kernels at 128K wait (ncu stall reasons a issued instruction), new only
#   ncub     the bound kernels under ncu (bench_kernels --quest), new only
#   quest    Quest (budget 4096) and full at 128K, each build of $V
#   quest32  the same at 32K
#   hit      TokenSelect's hit path (cache_theta -1) and full at 128K, each build of $V
#   cache    TokenSelect's selection cache (theta 0.9 and -0.5) at 32K and 128K, and bench/ts_cache.lua, each build of $V
#   masks    new test_cuda_prims --only masks (ge, where, the scores' skip) and its memcheck
#   ts       TokenSelect (defaults), Quest and full at 32K and 128K, each build of $V
#   memchk   compute-sanitizer memcheck over new test_cuda_prims --quick
#   ncuqd    Quest's decode-only kernels at 128K under ncu (the first decode step), new only
#   profq    the per-phase decode profile of Quest at 128K, each build of $V
#   profts   the per-phase decode profile of TokenSelect (cache off: the default, and the hit path) at 32K, each build of $V
#   reg8     full attention at 8K, three rounds of each build of $V
#   votebits bench/ts_vote_bits.lua on the CUDA backend, each build of $V, and whether their outputs are the same
#            bytes (TokenSelect's votes and selections on the bundled model)
#   ncusc    the one-row scores kernel in TokenSelect's decode at 32K under ncu (launch shape, time, where it waits), each
#            build of $V
#   ts32t    the timeline of TokenSelect's decode at 32K alone (trace's first row), each build of $V
#   ts128t   the same at 128K
#   hit128t  the same for the hit path (cache_theta -1) at 128K
#   ncusel   the selection kernels of bench_kernels --select under ncu (memory workload, warp states), new only
#   ncuattn  the hit path's list attention (one call, TokenSelect cache_theta -1 at 32K) under ncu --set full: details and
#            the 40 SASS lines with the most stall samples, new only
#   tcuda    make test-cuda's programs and test-cuda-sanitize's memchecks, new only
#   scores   new test_cuda_prims --only scores and its memcheck (--quick)
#   final32  issue 14's table, its 8K and 32K rows, each build of $V
#   final128 its 128K rows, each build of $V
#   splits   full attention's decode split over the cache rows: KS_CUDA_TC_SPLITS 0 (automatic: two blocks an SM where
#            the memory's peak rate is >= 30 GB/s an SM, else one), 16 and 33, interleaved, three rounds at 128K and
#            at 32K, each build of $V (session 41 measured it on an H200; an H100's choice is unmeasured)
#   t27      session 27's GPU tests: test_cuda_prims, test_cuda_policies, test_cuda (also --no-graphs), test_attn_list,
#            test_attn_decode_batch, memchecks of test_cuda_prims --quick (grow, scores, topk) and of the TokenSelect
#            segment cases of test_cuda_policies
#   s28      session 28's scores kernel (resident logits, tiles taken as they come): test_cuda_prims --only scores and
#            --only grow, test_cuda_policies, memcheck and racecheck of the scores cases (--quick), bench_kernels --select
#            (each build of $V, two rounds), then TokenSelect beside full at 32K and 128K (each build of $V)
#   t29      session 29's GPU tests: test_cuda_policies (with stories260K), test_cuda_prims --only masks, memcheck of the
#            TokenSelect segment cases of test_cuda_policies
#   s29      session 29's recorded selection cache: test_cuda_policies --only "decode handler", memcheck of its
#            cache_theta=0.5 case, then the cache step
#   s30      session 30's recorded Quest (a page tail followed on the device): test_attn_list --quick (page_case),
#            test_cuda_policies --only "segments: quest", their memchecks, then q30
#   t30      session 30's GPU tests: test_cuda_policies (with stories260K), test_attn_list --quick, test_cuda_prims
#            --only stage, test_cuda --quick, memcheck of the segment cases of test_cuda_policies
#   q30      Quest and full at 128K (--gen 16, the table's, and --gen 32) and at 32K, each build of $V
#   rec      session 27's recorded handlers: test_cuda_prims --only grow, the policies' decode handler cases, TokenSelect
#            and full at 32K and 128K (each build of $V), one logged run of new
#   s31      session 31's scores kernel (the partials combined in two passes, the group sums' exp) and the join at the
#            recording step: test_cuda_prims --only scores and --only grow, test_cuda_policies, memcheck of the scores
#            cases (--quick), bench_kernels --select (each build of $V, two rounds), then every decode step's wall of
#            TokenSelect at 128K (--gen 16, each build of $V), then the same runs of new with CUDA_MODULE_LOADING=EAGER,
#            and of full attention with and without it
#   s31t     s31's tests alone
#   s31r     full attention at 8K and 32K (--gen 8), then TokenSelect beside full at 32K (--gen 32) and 128K (--gen 16),
#            each two rounds of each build of $V (the spread of issue 14's rows across runs)
# Usage: bash bench/gpu_s20.sh STEP...
TAG=${TAG:-s20}; PK=${PK:-.data/$TAG/pk.tar.xz}
. bench/gpu_pack_env.sh
V=${V:-base new}
step_bound() {
    ( tst test_cuda_prims --only bound; tst test_cuda_prims --only page
      timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_prims --quick --only bound 2>&1 | tail -3
      timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_prims --only page 2>&1 | tail -3
    ) >> $O/tests.txt
}
step_stage() {
    ( tst test_cuda_prims --only stage
      timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_prims --only stage 2>&1 | tail -3
    ) >> $O/tests.txt
}
step_topk() {
    ( tst test_cuda_prims --only topk
      timeout 280 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_prims --quick --only topk 2>&1 | tail -3
    ) >> $O/tests.txt
}
step_attn() { ( tst test_cuda --quick; tst test_attn_list --quick
    timeout 280 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda --quick 2>&1 | tail -3 ) >> $O/tests.txt; }
step_seg32() { row 32K --lengths 32768 --gen 32 --policy none,noop >> $O/seg.txt; }
step_seg128() { row 128K --lengths 131040 --gen 16 --policy none,quest,gemfilter,fastkv --set quest.budget=4096 >> $O/seg.txt; }
step_alist() { for v in $V; do echo "== $v"; timeout 200 $R/$v/test_attn_list --bench-only 2>&1 | grep time; done >> $O/alist.txt; }
step_trace() {
    export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
    for v in $V; do for c in "ts32|--lengths 32768 --gen 12 --policy tokenselect" \
        "hit128|--lengths 131040 --gen 12 --policy tokenselect --set tokenselect.cache_theta=-1" \
        "quest128|--lengths 131040 --gen 12 --policy quest --set quest.budget=4096" "full128|--lengths 131040 --gen 12 --policy none"; do
        echo "== $v ${c%%|*}"; CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv KVSIEVE_POLICY_PATH=$R/$v/policies timeout 250 \
            $R/$v/kvsieve $B ${c#*|} 2>&1 | grep -E "^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:|ktrace"
        python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -40; rm -f $R/t.csv
    done; done >> $O/trace.txt
}
step_votebits() {
    for v in $V; do KVSIEVE_POLICY_PATH=$R/$v/policies timeout 120 $R/$v/kvsieve run bench/ts_vote_bits.lua cuda > $R/votes-$v.txt 2>&1
        echo "$v: $(wc -c < $R/votes-$v.txt) bytes, md5 $(md5sum < $R/votes-$v.txt | cut -c1-12), $(head -1 $R/votes-$v.txt)"
    done >> $O/votebits.txt
    set -- $V; cmp $R/votes-$1.txt $R/votes-$2.txt >> $O/votebits.txt 2>&1 && echo "same bytes: $1 $2" >> $O/votebits.txt
}
step_ncusc() {
    for v in $V; do echo "== $v"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 200 ncu --clock-control none -k regex:"sc1_" --launch-skip 64 \
        --launch-count 2 --section LaunchStats --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --section SourceCounters $R/$v/kvsieve $B --lengths 32768 --gen 4 --policy tokenselect 2>&1 | grep -v "^==PROF==" | tail -n +8
    done >> $O/ncu-scores.txt
}
tstrace() { # tstrace LABEL ARGS...: the timeline of TokenSelect's decode, each build of $V
    export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
    local t=$1; shift
    for v in $V; do echo "== $v $t"; CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv KVSIEVE_POLICY_PATH=$R/$v/policies timeout 250 \
        $R/$v/kvsieve $B --gen 12 --policy tokenselect "$@" 2>&1 | grep -E "^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:|ktrace"
        python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -40; rm -f $R/t.csv
    done >> $O/trace.txt
}
step_ts32t() { tstrace ts32 --lengths 32768; }
step_ts128t() { tstrace ts128 --lengths 131040; }
step_hit128t() { tstrace hit128 --lengths 131040 --set tokenselect.cache_theta=-1; }
step_ncusel() { # TokenSelect's selection kernels in bench_kernels --select (32K, then 128K) under ncu: speed of light,
    # memory workload, warp states and launch shape, new only
    timeout 280 ncu --clock-control none -k regex:"sc1_|tk_clu" --launch-count 8 --section SpeedOfLight --section LaunchStats \
        --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis $R/new/bench_kernels --select 2>&1 |
        grep -v "^==PROF==" | grep -vE "^ +(OPT|INF) |^          " > $O/ncu-sel.txt
}
step_ncuattn() {
    KVSIEVE_POLICY_PATH=$R/new/policies timeout 280 ncu --clock-control none -k regex:"attn_decode_tc" --launch-skip 44 --launch-count 1 \
        --set full --import-source yes -o $R/att $R/new/kvsieve $B --lengths 32768 --gen 4 --policy tokenselect \
        --set tokenselect.cache_theta=-1 > /dev/null 2>&1
    ncu --import $R/att.ncu-rep --page details > $O/ncu-attn.txt 2>&1
    ncu --import $R/att.ncu-rep --page source --csv --print-source sass > $R/src.csv 2>/dev/null
    python3 - $R/src.csv >> $O/ncu-attn.txt <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(i for i, r in enumerate(rows) if any('Source' == c or 'Address' in c for c in r))
h = rows[hdr]; data = rows[hdr + 1:]
def col(name):
    for i, c in enumerate(h):
        if c.strip().startswith(name): return i
    return None
cs, ca, ct = col('Warp Stall Sampling (All'), col('Source'), col('Address')
print('== columns:', h[:12])
def num(x):
    try: return float(x.replace(',', ''))
    except: return 0.0
tot = sum(num(r[cs]) for r in data if cs is not None and len(r) > cs)
print('== total stall samples', tot)
top = sorted(range(len(data)), key=lambda i: -num(data[i][cs]) if cs is not None and len(data[i]) > cs else 0)[:6]
for i in sorted(top):
    print('== context of line %d' % i)
    for j in range(max(0, i - 14), min(len(data), i + 3)):
        r = data[j]
        print('%s %6.0f  %s' % ('>' if j == i else ' ', num(r[cs]), r[ca] if ca is not None else ''))
for r in sorted(data, key=lambda r: -num(r[cs]) if cs is not None and len(r) > cs else 0)[:40]:
    print('%8.0f  %s  %s' % (num(r[cs]), r[ct] if ct is not None else '', r[ca] if ca is not None else ''))
PY
}
step_scores() {
    ( tst test_cuda_prims --only scores
      timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_prims --quick --only scores 2>&1 | tail -3
    ) >> $O/tests.txt
}
step_tcuda() {
    ( tst test_cuda; tst test_cuda --quick --pdl; tst test_cuda --quick --no-graphs; tst test_cuda --mma-prefill
      tst test_cuda_prims; tst test_cuda_policies --stories .data/stories260K; tst test_attn_decode_batch; tst test_attn_list
      tst test_gemm_rows; tst test_tp_cuda; tst test_wgmma
      for t in "test_cuda --quick" "test_cuda_prims --quick" "test_wgmma --quick"; do echo "== memcheck $t"
          timeout 280 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/$t 2>&1 | tail -2; done ) >> $O/tests.txt
}
step_prims() { tst test_cuda_prims >> $O/tests.txt; }
step_s31t() { # session 31's GPU tests of the scores kernel: see s31
    ( tst test_cuda_prims --only scores; tst test_cuda_prims --only grow; tst test_cuda_policies --stories .data/stories260K
      timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_prims --quick --only scores 2>&1 | tail -3
    ) >> $O/tests.txt
}
step_s31() { # session 31: see the list above
    step_s31t
    step_ks
    for v in $V; do
        echo "== $v"
        CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$O/w-$v.csv KVSIEVE_POLICY_PATH=$R/$v/policies timeout 250 $R/$v/kvsieve $B \
            --lengths 131040 --gen 16 --policy tokenselect 2>&1 | grep -E '^[a-z]+ +[0-9]+ '
        python3 bench/ktrace.py $O/w-$v.csv --steps 8 --skip 2 --walls | head -3
        rm -f $O/w-$v.csv
    done >> $O/walls.txt 2>&1
    # the first decode step's cost: the same runs of new with every kernel loaded at start
    # (CUDA_MODULE_LOADING=EAGER), and full attention's with and without it
    for c in "ts-eager:EAGER:tokenselect" "full:LAZY:none" "full-eager:EAGER:none"; do
        n=${c%%:*}; m=${c#*:}; pol=${m#*:}; m=${m%%:*}
        echo "== $n"
        CUDA_MODULE_LOADING=$m CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$O/w-$n.csv KVSIEVE_POLICY_PATH=$R/new/policies \
            timeout 250 $R/new/kvsieve $B --lengths 131040 --gen 16 --policy $pol 2>&1 | grep -E '^[a-z]+ +[0-9]+ '
        python3 bench/ktrace.py $O/w-$n.csv --steps 8 --skip 2 --walls | head -3
        rm -f $O/w-$n.csv
    done >> $O/walls.txt 2>&1
}
step_s31r() { # see s31r above
    for r in 1 2; do
        ( row "8K-r$r" --lengths 8192 --gen 8 --policy none
          row "32K-full-r$r" --lengths 32768 --gen 8 --policy none ) >> $O/reg.txt
    done
    for r in 1 2; do
        ( row "32K-r$r" --lengths 32768 --gen 32 --policy none,tokenselect
          row "128K-r$r" --lengths 131040 --gen 16 --policy none,tokenselect ) >> $O/ts.txt
    done
}
step_pol() { tst test_cuda_policies --stories .data/stories260K >> $O/tests.txt; }
step_kq() { for r in 1 2; do for v in $V; do echo "== $v round $r"; timeout 200 $R/$v/bench_kernels --quest 2>&1 | grep quest; done; done >> $O/kq.txt; }
step_ncut() { # the top-k kernels of bench_kernels --quest and --select under ncu, each build of $V
    for v in $V; do for a in --quest --select; do echo "== $v $a"; timeout 250 ncu --clock-control none -k regex:"tk_" --launch-count 60 \
        --section SpeedOfLight $R/$v/bench_kernels $a 2>&1 | grep -E "^  [a-zA-Z_].*\(|Duration"; done; done > $O/ncu-topk.txt
}
step_ks() { for r in 1 2; do for v in $V; do echo "== $v round $r"; timeout 200 $R/$v/bench_kernels --select 2>&1 | grep select; done; done >> $O/ks.txt; }
step_ncub() { # bound kernel launches of bench_kernels --quest under ncu (32K, then 128K): f32 and packed, new only
    timeout 250 ncu --clock-control none -k regex:bound_scores --launch-count 400 --section SpeedOfLight --section Occupancy \
        $R/new/bench_kernels --quest 2>&1 | grep -E "bound_scores_|Duration|DRAM Throughput|Achieved Occupancy" > $O/ncu-bound.txt
}
step_ncuq() { # Quest's and TokenSelect's decode kernels under ncu: per-kernel summary of the first decode steps
    local K='regex:tk_|page_rows|bound_scores|attn_decode|attn_combine|gather|rope|add_|index|sc1_|scores|check_idx|argmax|embed|rms|swiglu|gemv|gemm'
    timeout 280 ncu --clock-control none -k "$K" --launch-count 400 --print-summary per-kernel --section SpeedOfLight \
        $R/new/kvsieve $B --lengths 131040 --gen 2 --policy quest --set quest.budget=4096 > $O/ncu-quest.txt 2>&1
    timeout 200 ncu --clock-control none -k "$K" --launch-count 400 --print-summary per-kernel --section SpeedOfLight \
        $R/new/kvsieve $B --lengths 32768 --gen 2 --policy tokenselect > $O/ncu-ts.txt 2>&1
}
step_ncus() { # the selection's kernels (sc1_logits, sc1_vote, tk_coop) under ncu: bench_kernels --select, each build of $V
    for v in $V; do echo "== $v"; timeout 250 ncu --clock-control none -k regex:"sc1_|tk_" --section SpeedOfLight \
        $R/$v/bench_kernels --select 2>&1 | grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput"; done > $O/ncu-sel.txt
}
step_ncuqd() { # Quest's decode kernels at 128K under ncu (first decode step: kernels that run only in decode)
    timeout 280 ncu --clock-control none -k regex:"attn_decode_tc|attn_combine|tk_|bound_scores|page_rows|check_idx|attn_rope" \
        --launch-count 80 --section SpeedOfLight $R/new/kvsieve $B --lengths 131040 --gen 2 --policy quest --set quest.budget=4096 2>&1 |
        grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput" > $O/ncu-questd.txt
}
step_ncuw() { # stall reasons of Quest's decode kernels at 128K (first decode step), new only
    local M=gpu__time_duration.sum,smsp__issue_active.avg.per_cycle_active,smsp__warps_active.avg.per_cycle_active
    for r in no_instruction short_scoreboard long_scoreboard barrier membar wait math_pipe_throttle mio_throttle lg_throttle dispatch_stall; do
        M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio; done
    timeout 280 ncu --clock-control none -k regex:"attn_decode_tc|attn_combine|tk_|bound_scores|page_rows|list_stage" \
        --launch-count 40 --metrics $M $R/new/kvsieve $B --lengths 131040 --gen 2 --policy quest --set quest.budget=4096 2>&1 |
        grep -E "^  [a-zA-Z_].*\(|gpu__|smsp__" > $O/ncu-stall.txt
}
step_profq() { # the per-phase decode profile of Quest at 128K, each build of $V
    for v in $V; do echo "== $v Quest 128K"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 250 $R/$v/kvsieve $B --lengths 131040 --gen 16 \
        --policy quest --set quest.budget=4096 --profile 2>&1 | sed -n '/^profile/,/^rates/p'; done >> $O/prof.txt 2>&1
}
step_profts() {
    for v in $V; do for th in 0 -1; do echo "== $v TokenSelect 32K cache_theta $th"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 250 \
        $R/$v/kvsieve $B --lengths 32768 --gen 32 --policy tokenselect --set tokenselect.cache_theta=$th --profile 2>&1 |
        sed -n '/^profile/,/^rates/p'; done; done >> $O/prof.txt 2>&1
}
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
row() { # row TAG ARGS...: each build of $V
    local t=$1; shift
    for v in $V; do
        KVSIEVE_POLICY_PATH=$R/$v/policies timeout 250 $R/$v/kvsieve $B "$@" 2>&1 |
            grep -E "^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:" | sed "s/^/$t $v: /"
    done
}
step_splits() {
    for r in 1 2 3; do for L in 131040 32768; do for sp in 0 16 33; do
        KS_CUDA_TC_SPLITS=$sp row "$L-splits$sp-r$r" --lengths $L --gen $([ $L = 32768 ] && echo 32 || echo 16) --policy none
    done; done; done >> $O/splits.txt
}
step_hit() { row 128K-hit --lengths 131040 --gen 32 --policy none,tokenselect --set tokenselect.cache_theta=-1 >> $O/hit.txt; }
step_quest() { row 128K-quest --lengths 131040 --gen 16 --policy none,quest --set quest.budget=4096 >> $O/quest.txt; }
step_quest32() { row 32K-quest --lengths 32768 --gen 32 --policy none,quest --set quest.budget=4096 >> $O/quest.txt; }
step_cache() { # TokenSelect's selection cache, cache_theta 0.9 (random weights: few hits) and -0.5 (nearly every
    # step a hit decided by the cosine), with full, 32K and 128K, each build of $V; then bench/ts_cache.lua (the bundled
    # model's real decode: hit rate and TPOT) on each build
    ( row 32K-c9 --lengths 32768 --gen 32 --policy none,tokenselect --set tokenselect.cache_theta=0.9
      row 32K-c-5 --lengths 32768 --gen 32 --policy tokenselect --set tokenselect.cache_theta=-0.5
      row 128K-c9 --lengths 131040 --gen 16 --policy none,tokenselect --set tokenselect.cache_theta=0.9
      row 128K-c-5 --lengths 131040 --gen 16 --policy tokenselect --set tokenselect.cache_theta=-0.5
      for v in $V; do echo "== $v ts_cache.lua"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 120 $R/$v/kvsieve run bench/ts_cache.lua cuda; done
    ) >> $O/cache.txt
}
step_masks() { # the mask primitives and the scores' skip against the CPU, and their memcheck (new)
    ( tst test_cuda_prims --only masks; tst test_cuda_prims --quick --only scores
      timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_prims --quick --only masks 2>&1 | tail -3
    ) >> $O/tests.txt
}
step_ts() { # TokenSelect (defaults), Quest and full: 32K (gen 32) and 128K (gen 16), each build of $V
    ( row 32K --lengths 32768 --gen 32 --policy none,tokenselect
      row 128K --lengths 131040 --gen 16 --policy none,tokenselect,quest --set quest.budget=4096 ) >> $O/ts.txt
}
step_memchk() { # compute-sanitizer over new test_cuda_prims --quick (every primitive)
    timeout 280 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_prims --quick 2>&1 | tail -3 >> $O/tests.txt
}
step_reg8() { # full attention at 8K, three rounds of each build of $V
    for r in 1 2 3; do row 8K --lengths 8192 --gen 32 --policy none; done >> $O/reg.txt
}
step_final32() { # issue 14's table, 8K and 32K rows: every row base then new (each build with its own policy files)
    ( row 8K --lengths 8192 --gen 8 --policy none
      row 32K --lengths 32768 --gen 32 --policy none,noop,tokenselect,quest --set quest.budget=4096
      row 32K-hit --lengths 32768 --gen 32 --policy tokenselect --set tokenselect.cache_theta=-1
      row 32K-sllm-static --lengths 32768 --gen 32 --policy streamingllm --set budget=2048
      row 32K-sllm-rolling --lengths 32768 --gen 32 --policy streamingllm --set budget=2048 --set rolling=true ) >> $O/final.txt
}
step_final128() { # issue 14's table, 128K rows
    ( row 128K --lengths 131040 --gen 16 --policy none,tokenselect,quest,gemfilter,fastkv --set quest.budget=4096
      row 128K-hit --lengths 131040 --gen 32 --policy none,tokenselect --set tokenselect.cache_theta=-1 ) >> $O/final.txt
}
step_rec() { # session 27: the recorded handlers' kernels and policy runs (new), then TokenSelect beside full at 32K and
    # 128K, each build of $V, and one run of new with its log (whether the handlers recorded, and why not)
    ( tst test_cuda_prims --only grow; tst test_cuda_policies --only "decode handler" ) >> $O/tests.txt
    ( row 32K --lengths 32768 --gen 32 --policy none,tokenselect
      row 128K --lengths 131040 --gen 16 --policy none,tokenselect ) >> $O/rec.txt
    KVSIEVE_POLICY_PATH=$R/new/policies timeout 200 $R/new/kvsieve $B --lengths 32768 --gen 8 --policy tokenselect > $O/rec-log.txt 2>&1
}
step_s28() { # session 28: the scores kernel's resident path against the CPU, its memchecks, its time, TokenSelect's TPOT
    ( tst test_cuda_prims --only scores; tst test_cuda_prims --only grow; tst test_cuda_policies --stories .data/stories260K
      for t in memcheck racecheck synccheck; do echo "== $t test_cuda_prims --quick --only scores"
          timeout 200 compute-sanitizer --tool $t --error-exitcode 1 $R/new/test_cuda_prims --quick --only scores 2>&1 | tail -2; done
    ) >> $O/tests.txt
    for r in 1 2; do for v in $V; do echo "== $v round $r"; timeout 200 $R/$v/bench_kernels --select 2>&1 | tail -n 30; done; done >> $O/ks.txt
    ( row 32K --lengths 32768 --gen 32 --policy none,tokenselect
      row 128K --lengths 131040 --gen 32 --policy none,tokenselect ) >> $O/s28.txt
}
step_t27() { # session 27's GPU tests of the final build: the programs its changes reach, and memchecks of the new paths
    ( tst test_cuda_prims; tst test_cuda_policies --stories .data/stories260K; tst test_cuda; tst test_cuda --quick --no-graphs
      tst test_attn_list --quick; tst test_attn_decode_batch
      for t in "test_cuda_prims --quick --only grow" "test_cuda_prims --quick --only scores" "test_cuda_prims --quick --only topk"; do
          echo "== memcheck $t"; timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/$t 2>&1 | tail -2; done
      echo "== memcheck test_cuda_policies --quick --only segments: tokenselect"
      timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_policies --quick --only "segments: tokenselect" 2>&1 | tail -4
    ) >> $O/tests.txt
}
step_s29() { # session 29: TokenSelect's device-decided selection cache recorded and replayed: the policies' decode
    # handler cases (new), memcheck of the cache case, then the cache step (each build of $V)
    ( tst test_cuda_policies --only "decode handler"
      echo "== memcheck test_cuda_policies --quick --only cache_theta=0.5"
      timeout 200 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_policies --quick --only "cache_theta=0.5" 2>&1 | tail -4
    ) >> $O/tests.txt
    step_cache
}
step_t29() { # session 29's GPU tests of the final build: the policies against the CPU (the selection cache's device path
    # included), the mask primitives, memcheck of the TokenSelect segment cases (the recorded cache among them)
    ( tst test_cuda_policies --stories .data/stories260K; tst test_cuda_prims --only masks
      echo "== memcheck test_cuda_policies --quick --only segments: tokenselect"
      timeout 200 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_policies --quick --only "segments: tokenselect" 2>&1 | tail -4
    ) >> $O/tests.txt
}
step_s30() { # session 30: Quest's handlers recorded within its current page
    ( tst test_attn_list --quick; tst test_cuda_policies --only "segments: quest"
      echo "== memcheck test_attn_list --quick"
      timeout 200 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_attn_list --quick 2>&1 | tail -3
      echo "== memcheck test_cuda_policies --quick --only segments: quest"
      timeout 200 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_policies --quick --only "segments: quest" 2>&1 | tail -3
    ) >> $O/tests.txt
    step_q30
}
step_t30() { # session 30's GPU tests of the final build: the policies against the CPU (stories260K too), the
    # attention over lists (page tails), the staging, test_cuda --quick, memchecks of the Quest and TokenSelect segment cases
    ( tst test_cuda_policies --stories .data/stories260K; tst test_attn_list --quick; tst test_cuda_prims --only stage
      tst test_cuda --quick
      echo "== memcheck test_cuda_policies --quick --only segments:"
      timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_policies --quick --only "segments:" 2>&1 | tail -3
    ) >> $O/tests.txt
}
step_q30() { # session 30: one round of Quest beside full (128K --gen 16 and 32, 32K), each build of $V
    ( row 128K-g16 --lengths 131040 --gen 16 --policy none,quest --set quest.budget=4096
      row 128K-g32 --lengths 131040 --gen 32 --policy none,quest --set quest.budget=4096
      row 32K --lengths 32768 --gen 32 --policy none,quest --set quest.budget=4096 ) >> $O/quest.txt
}
for s in "$@"; do echo "== step $s $(date +%T)"; step_$s; done
rm -rf $R
