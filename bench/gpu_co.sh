# Session 14 (coordinator): the one-launch top-k (kernels/prim_topk.cu) and the page primitives
# (kernels/prim_page.cu) on the GPU: their tests against the CPU, the selection kernels' times
# (bench_kernels --select / --quest, the build before the change as bk_old beside the new one),
# and TokenSelect / Quest TPOT beside main's binary from before (.data/base) in the same call.
# Carry .data/co (tests, kern) and .data/co2 + .data/base (b32, b128), .data/stories260K (tests).
# Usage: bash bench/gpu_co.sh [tests] [kern] [pol] [b32] [b128]
R=$(mktemp -d); mkdir -p $R/base $R/new "$OUT/co"
[ -f .data/base/kvsieve.xz ] && xz -dc .data/base/kvsieve.xz > $R/base/kvsieve
for f in .data/co/*.xz .data/co2/*.xz; do [ -f $f ] && xz -dc $f > $R/new/$(basename $f .xz); done
chmod +x $R/*/*
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
N=$R/new O="$OUT/co"
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/card.txt
step_tests() {
    ( timeout 100 $N/test_cuda_prims --only topk 2>&1 | grep -v "^  ok" | tail -12
      timeout 60 $N/test_cuda_prims --only page 2>&1 | grep -v "^  ok" | tail -12 ) > $O/tests.txt
}
step_pol() { timeout 150 $N/test_cuda_policies --stories .data/stories260K > $O/policies.txt 2>&1; }
step_kern() {
    for v in bk_old bench_kernels bk_old bench_kernels; do echo "== $v"; timeout 60 $N/$v --quest 2>&1 | grep quest; done > $O/kern.txt
    timeout 60 $N/bench_kernels --select > $O/kern_select.txt 2>&1
}
step_b32() {
    for v in base new base new; do echo "== $v"; timeout 100 $R/$v/kvsieve $B --lengths 32768 --gen 32 --policy none,tokenselect,quest 2>&1; done > $O/b32.txt
}
step_b128() {
    for v in base new; do echo "== $v 128K"; timeout 150 $R/$v/kvsieve $B --lengths 131040 --gen 16 --policy quest 2>&1; done > $O/b128.txt
}
steps=${*:-tests kern pol b32 b128}
for s in $steps; do step_$s; done
