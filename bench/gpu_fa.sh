# Issue 14 (helper "fusedattn"): decode attention over a device index list, pre-RoPE keys rotated
# inside the tensor-core kernel. One device call (GPU 0), with a deadline: each step runs only
# while the call's wall time is under its limit (DEADLINE seconds, default 170). Steps, in order:
#   test     test_attn_list --bench: the new path against the CPU backend and bit for bit against
#            the gather path it replaced, then one layer's time at the 8B shape (list 2688 of
#            32768 and of 131072 rows: old composition, old kernels, new backend call, new kernel,
#            the new kernel at 8..49 splits)
#   b32      kvsieve bench at 32768 --gen 32: TokenSelect's hit path (--set
#            tokenselect.cache_theta=-1; the new build with none beside it), then TokenSelect's
#            default; new build, main before this work (.data/fa-pre), session 13's main
#            (.data/base); each build when carried
#   prof     the hit path at 32K with --profile (per-phase times, synchronised), new and pre
#   b128     the same as b32 at 131040 --gen 16 (new and pre)
#   memcheck compute-sanitizer memcheck of test_attn_list --quick
# Carry .data/fa (stripped, xz -9: kvsieve.xz, test_attn_list.xz: 4.7 MB) and .data/base; main
# before this work is .data/fa-pre/kvsieve.xz (2.6 MB, over the limit beside them): a second call
# carrying .data/fa-pre and .data/fa/kvsieve.xz runs `bash bench/gpu_fa.sh b32 prof b128` (the
# steps skip a build that is not there).
# Outputs under $OUT/fa/: card.txt, test.txt, b32.txt, prof.txt, b128.txt, memcheck.txt.
# Usage: bash bench/gpu_fa.sh [step ...]   (all of the above when none)
T0=$(date +%s); DEADLINE=${DEADLINE:-170}
S=.data/fa; R=$(mktemp -d); mkdir -p $R/pre $R/base; O=${OUT:-/tmp}/fa; mkdir -p $O
for f in $S/*.xz; do [ -f $f ] && xz -dc $f > $R/$(basename $f .xz); done
[ -f .data/fa-pre/kvsieve.xz ] && xz -dc .data/fa-pre/kvsieve.xz > $R/pre/kvsieve
[ -f .data/base/kvsieve.xz ] && xz -dc .data/base/kvsieve.xz > $R/base/kvsieve
chmod +x $R/* $R/pre/* $R/base/* 2>/dev/null
export CUDA_VISIBLE_DEVICES=0 NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/card.txt 2>&1
C="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
HIT="--set tokenselect.cache_theta=-1"
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
run() { # run LIMIT CMD...: at most LIMIT seconds and never past the deadline
    local l=$1 r; shift; r=$(left); [ $r -lt $l ] && l=$r
    if [ $l -lt 5 ]; then echo "skipped: $(left) s left"; return; fi
    timeout $l "$@" 2>&1 | grep -v "^memory \|^peak host\|^backend memory"
    echo "rc=${PIPESTATUS[0]} ($(( $(date +%s) - T0 )) s into the call)"
}
step_test() { [ -x $R/test_attn_list ] && run 40 $R/test_attn_list --bench > $O/test.txt; }
bench_len() { # bench_len LEN GEN FILE BUILDS...
    local len=$1 gen=$2 out=$3; shift 3
    for b in "$@"; do
        local x=$R/kvsieve; [ $b != new ] && x=$R/$b/kvsieve
        [ -x $x ] || continue
        local pol=tokenselect; [ $b = new ] && pol=none,tokenselect
        echo "== $b: hit path" >> $out; run 40 $x $C --lengths $len --gen $gen --policy $pol $HIT >> $out
        echo "== $b: default" >> $out; run 30 $x $C --lengths $len --gen $gen --policy tokenselect >> $out
    done
}
step_b32() { bench_len 32768 32 $O/b32.txt new pre base; }
step_prof() {
    for b in new pre; do
        local x=$R/kvsieve; [ $b != new ] && x=$R/$b/kvsieve
        [ -x $x ] || continue
        echo "== $b: hit path --profile" >> $O/prof.txt
        run 30 $x $C --lengths 32768 --gen 32 --policy tokenselect $HIT --profile >> $O/prof.txt
    done
}
step_b128() { bench_len 131040 16 $O/b128.txt new pre; }
step_memcheck() {
    [ -x $R/test_attn_list ] || return
    run 40 compute-sanitizer --tool memcheck --error-exitcode 1 $R/test_attn_list --quick > $R/mc.txt
    tail -5 $R/mc.txt > $O/memcheck.txt
}
for s in ${*:-test b32 prof b128 memcheck}; do echo "== step $s at $(( $(date +%s) - T0 )) s"; step_$s; done
rm -rf $R
cat $O/card.txt; tail -n 60 $O/*.txt 2>/dev/null | cut -c1-200
true
