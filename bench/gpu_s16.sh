# Session 16's device calls (GPU 0). Binaries from one xz'd tar (PK=FILE, default .data/s16/pk.tar.xz):
# base/ (main before the session, bff... see bench/NOTES.md) and new/ (this build); carry it and, for
# the policy tests, .data/stories260K. Each step writes one file under $OUT/s16/ (the tool returns <= 8).
#   sel     bench_kernels --select, base then new: TokenSelect's scores and top-k at one layer, 32K and 128K
#   prims   test_cuda_prims (full tier) of the new build
#   tests   test_cuda_policies, test_cuda --quick, test_attn_list --quick of the new build
#   memcheck compute-sanitizer over test_cuda_prims --quick --only scores
#   ncu     ncu of the scores kernels in bench_kernels --select, base and new
#   b16     issue 16 at 4K, B = 1, 16, 64, base then new (B16_OPS=1: first test_attn_decode_batch --time-only and
#           test_gemm_rows --bench at 64 rows)
#   reg     full TTFT 8K / 32K / 128K and GemFilter / FastKV at 128K, base then new
#   b14     32K: full and TokenSelect, base then new
#   b14l    128K: full, TokenSelect and Quest, base then new; 32K Quest and the hit path
# Usage: bash bench/gpu_s16.sh STEP...
PK=${PK:-.data/s16/pk.tar.xz}; R=$(mktemp -d); O="$OUT/s16"; mkdir -p $O
xz -dc $PK | tar xf - -C $R
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} KS_STORIES=.data/stories260K
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/card.txt
step_sel() {
    for v in base/bench_kernels new/bench_kernels $(cd $R; ls new/bench_kernels_* 2>/dev/null) new/bench_kernels base/bench_kernels; do
        echo "== $v"; timeout 120 $R/$v --select 2>&1 | grep -E "select: scores"; done > $O/sel.txt
}
tst() { # tst BINARY ARGS...: its failures and summary
    [ -x $R/new/$1 ] || return 0
    echo "== $*"; local b=$1; shift
    timeout 250 $R/new/$b "$@" 2>&1 | grep -v "^  ok" | tail -12
}
step_prims() { tst test_cuda_prims >> $O/tests.txt; }
step_tests() {
    ( tst test_cuda_policies --stories .data/stories260K; tst test_cuda --quick; tst test_attn_list --quick; tst test_gemm_rows
      tst test_attn_decode_batch --quick ) >> $O/tests.txt
}
step_memcheck() { # the scores kernel, the put sizes, the n-row q|k|v and MLP (joined weights, the norm's bf16 copy)
    ( timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_prims --quick --only scores 2>&1 | tail -2
      timeout 100 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda --quick --only put 2>&1 | tail -2
      timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda --quick --only e2e 2>&1 | tail -2 ) >> $O/memcheck.txt
}
step_ncu() { # the logits and vote kernels alone (ncu, clocks left alone): grid and median time per shape
    for v in base/bench_kernels new/bench_kernels $(cd $R; ls new/bench_kernels_* 2>/dev/null); do
        echo "== $v"
        timeout 200 ncu --clock-control none -k regex:sc1 --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
            --launch-count 120 $R/$v --select 2>&1 |
            python3 -c '
import re, sys, collections
t = collections.defaultdict(list); k = None
for ln in sys.stdin:
    if "sc1_" in ln and "Context" in ln: k = ln.strip().split(", Context")[0]
    elif k and "gpu__time_duration" in ln: t[k].append(float(ln.split()[-1]))
    elif k and "dram__throughput" in ln: t[k + " dram%"].append(float(ln.split()[-1]))
for k, v in sorted(t.items()):
    v.sort(); print("%-90s median %8.2f  n %d" % (k, v[len(v) // 2], len(v)))'
    done > $O/ncu.txt
}
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
row() { # row TAG ARGS...: base then new
    local t=$1; shift
    for v in base new; do
        timeout 250 $R/$v/kvsieve $B "$@" 2>&1 | grep -E "^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:" | sed "s/^/$t $v: /"
    done
}
step_b14() { row 32K --lengths 32768 --gen 32 --policy none,tokenselect >> $O/b14.txt; }
step_b14l() {
    ( row 128K --lengths 131040 --gen 16 --policy none,tokenselect,quest
      row 32K-hit --lengths 32768 --gen 32 --policy tokenselect,quest --set tokenselect.cache_theta=-1 ) >> $O/b14.txt
}
step_reg() { # issue 14's no-regression rows: full TTFT 8K / 32K / 128K, GemFilter and FastKV at 128K, base then new
    ( row 8K --lengths 8192 --gen 8 --policy none
      row 32K --lengths 32768 --gen 8 --policy none
      row 128K --lengths 131040 --gen 16 --policy none,gemfilter,fastkv ) >> $O/reg.txt
}
step_b16() { # issue 16: the batched attention kernel alone (B x 4096 keys), the per-op GEMMs at 64 rows, the steps
    ( [ -n "$B16_OPS" ] && tst test_attn_decode_batch --time-only
      [ -n "$B16_OPS" ] && [ -x $R/new/test_gemm_rows ] && timeout 250 $R/new/test_gemm_rows --bench 2>&1 | grep "n=64"
      for v in base new; do timeout 250 $R/$v/kvsieve $B --lengths 4096 --gen 32 --batch 1,16,64 2>&1 |
          grep -E "^tokens|^4096|kvsieve:" | sed "s/^/$v: /"; done ) >> $O/b16.txt
}
for s in "$@"; do echo "== step $s $(date +%T)"; step_$s; done
rm -rf $R
