# Issue 14 (helper "fusedattn"): decode attention over a device index list, pre-RoPE keys rotated
# inside the tensor-core kernel. One device call (GPU 0), with a deadline: each step runs only
# while the call's wall time is under its limit (DEADLINE seconds, default 230). Steps, in order:
#   test     test_attn_list --bench: the new path against the CPU backend and bit for bit against
#            the gather path it replaced, then one layer's time at the 8B shape (list 2688 of
#            32768 and of 131072 rows: old composition, old kernels, new backend call, new kernel)
#   parity   test_cuda --only attention (every attention path vs the CPU; device lists equal to
#            host lists bit for bit) and test_cuda_policies --only tokenselect (TokenSelect's kept
#            sets and ids, device primitives vs host primitives)
#   b32      kvsieve bench at 32768 --gen 32: none + TokenSelect's hit path
#            (--set tokenselect.cache_theta=-1), then TokenSelect's default; new build, then the
#            build before this work (.data/fa/base) on the same card
#   b128     the same at 131040 --gen 16
#   memcheck compute-sanitizer memcheck of test_attn_list --quick
# Carry .data/fa (stripped, xz'd: kvsieve.xz, test_attn_list.xz, test_cuda.xz,
# test_cuda_policies.xz, base/kvsieve.xz). Outputs under $OUT/fa/.
# Usage: bash bench/gpu_fa.sh [step ...]   (all of the above when none)
T0=$(date +%s); DEADLINE=${DEADLINE:-230}
S=.data/fa; R=$(mktemp -d); mkdir -p $R/base; O=${OUT:-/tmp}/fa; mkdir -p $O
for f in $S/*.xz; do [ -f $f ] && xz -dc $f > $R/$(basename $f .xz); done
for f in $S/base/*.xz; do [ -f $f ] && xz -dc $f > $R/base/$(basename $f .xz); done
chmod +x $R/* $R/base/* 2>/dev/null
export CUDA_VISIBLE_DEVICES=0 NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/card.txt 2>&1
C="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
run() { # run LIMIT CMD...: at most LIMIT seconds and never past the deadline
    local l=$1 r; shift; r=$(left); [ $r -lt $l ] && l=$r
    if [ $l -lt 5 ]; then echo "skipped: $(left) s left"; return; fi
    timeout $l "$@" 2>&1; echo "rc=$? ($(( $(date +%s) - T0 )) s into the call)"
}
step_test() { run 60 $R/test_attn_list --bench > $O/test.txt; }
step_parity() {
    run 40 $R/test_cuda --only attention > $O/test_cuda.txt
    run 30 $R/test_cuda_policies --only tokenselect --long 0 > $O/test_cuda_policies.txt
}
bench_len() { # bench_len LEN GEN TAG
    for b in new base; do
        local x=$R/kvsieve; [ $b = base ] && x=$R/base/kvsieve
        run 60 $x $C --lengths $1 --gen $2 --policy none,tokenselect --set tokenselect.cache_theta=-1 > $O/$3_hit_$b.txt
        run 40 $x $C --lengths $1 --gen $2 --policy tokenselect > $O/$3_default_$b.txt
    done
}
step_b32() { bench_len 32768 32 b32; }
step_b128() { bench_len 131040 16 b128; }
step_memcheck() {
    run 60 compute-sanitizer --tool memcheck --error-exitcode 1 $R/test_attn_list --quick > $O/memcheck_full.txt
    tail -5 $O/memcheck_full.txt > $O/memcheck.txt; rm -f $O/memcheck_full.txt
}
for s in ${*:-test parity b32 b128 memcheck}; do echo "== step $s at $(( $(date +%s) - T0 )) s"; step_$s; done
rm -rf $R
cat $O/card.txt; tail -n 40 $O/*.txt 2>/dev/null | cut -c1-200
true
