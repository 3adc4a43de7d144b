# Session 14 (coordinator): the one-launch top-k (kernels/prim_topk.cu) on the GPU: its tests
# against the CPU, the selection kernels' times (bench_kernels --select), and TokenSelect / Quest
# TPOT with it beside main's binary from before (.data/base) in the same call.
# Carry .data/co and .data/base. Usage: bash bench/gpu_co.sh [tests] [kern] [b32] [b128]
S=.data/co; R=$(mktemp -d); mkdir -p $R/base $R/new "$OUT/co"
xz -dc .data/base/kvsieve.xz > $R/base/kvsieve
for f in $S/*.xz; do xz -dc $f > $R/new/$(basename $f .xz); done
chmod +x $R/*/*
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
N=$R/new O="$OUT/co"
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/card.txt
step_tests() { timeout 150 $N/test_cuda_prims --only topk 2>&1 | grep -v "^  ok" | tail -30 > $O/tests.txt; }
step_kern() { timeout 60 $N/bench_kernels --select > $O/kern.txt 2>&1; }
step_b32() {
    for v in base new base new; do echo "== $v"; timeout 100 $R/$v/kvsieve $B --lengths 32768 --gen 32 --policy none,tokenselect,quest 2>&1; done > $O/b32.txt
}
step_b128() {
    for v in base new; do echo "== $v 128K"; timeout 150 $R/$v/kvsieve $B --lengths 131040 --gen 16 --policy tokenselect,quest 2>&1; done > $O/b128.txt
}
steps=${*:-tests kern b32 b128}
for s in $steps; do step_$s; done
