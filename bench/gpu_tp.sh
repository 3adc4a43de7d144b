# Issue 17 on a 2-GPU machine (device kind nvidia-h100-x2), one device call: tensor parallelism
# over NCCL. Carry .data/nccl (stripped, xz'd: kvsieve.xz, test_tp_cuda.xz, nccl_allreduce.xz,
# from `make CUDA=1 BUILD=build-nccl-cuda ...`) and .data/stories260K.
# Usage: bash bench/gpu_tp.sh [check] [tests] [allreduce] [b8] [b128] [b70] [p8] [b70p]   (all when none)
#   check      the cards, their links, NCCL in the toolkit
#   tests      test_tp_cuda: one NCCL rank == plain CUDA; two ranks == one GPU (ids, kept sets)
#   allreduce  nccl_allreduce on both GPUs (f32 and bf16, 8 KB .. 1 GB; algbw, busbw)
#   b8 / b128  kvsieve bench, Llama-3.1-8B shape (random weights), --tp 1 then --tp 2, 32K / 128K
#   b70        the 70B shape at 32K, --tp 2, full attention: all 80 layers if they fit, else L70
#   p8         the 8B shape at 32K, none, gemfilter, tokenselect, --tp 1 then --tp 2
#   b70p       the 70B shape at L70P layers, --tp 2: none, gemfilter, tokenselect (P70; the policy views
#              add a whole KV copy on rank 0: 80 layers on 141 GB cards, 48 on 80 GB ones)
# NVLink multicast stays off (the machines are shared): NCCL_NVLS_ENABLE=0 below.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S=.data/nccl; B=$(mktemp -d)
for f in $S/*.xz; do xz -dc $f > $B/$(basename $f .xz); done
chmod +x $B/*
export KS_STORIES=.data/stories260K
# the policy rows keep a whole KV copy on rank 0: all 80 layers where a card holds it (H200), else 48
big=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
L70=${L70:-64}; L70P=${L70P:-$([ "${big:-0}" -gt 100000 ] && echo 80 || echo 48)}
if ldd $B/kvsieve | grep -q "libnccl.*not found"; then
    # the toolkit has no NCCL: the one PyTorch brings
    export LD_LIBRARY_PATH=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))')/lib:$LD_LIBRARY_PATH
fi
C8=bench/configs/llama-3.1-8b.json
cfg70() { sed "s/\"num_hidden_layers\": 80/\"num_hidden_layers\": $1/" bench/configs/llama-3.1-70b.json > $B/70b-$1.json; echo $B/70b-$1.json; }
bench() { timeout ${T:-200} $B/kvsieve bench --backend cuda --repeat 1 "$@" 2>&1; echo "rc=$?"; }
step_check() {
    ( nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
      nvidia-smi topo -m; ls -l /usr/local/cuda/lib*/libnccl* 2>&1; ldd $B/kvsieve | grep -i nccl ) > $OUT/check.txt 2>&1
}
step_tests() { timeout 240 $B/test_tp_cuda > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt; }
step_allreduce() { timeout 120 $B/nccl_allreduce -g 2 > $OUT/allreduce.txt 2>&1; echo "rc=$?" >> $OUT/allreduce.txt; }
step_b8() {
    for tp in 1 2; do echo "== 8B 32K tp $tp"; bench --random-weights $C8 --tp $tp --lengths 32768 --gen 16; done >> $OUT/bench8.txt
}
step_b128() {
    for tp in 1 2; do echo "== 8B 128K tp $tp"; T=300 bench --random-weights $C8 --tp $tp --lengths 131040 --gen 16; done >> $OUT/bench8.txt
}
step_b70() {
    ( echo "== 70B shape, 80 layers, 32K, tp 2, full"; T=300 bench --random-weights $(cfg70 80) --tp 2 --lengths 32768 --gen 8 ) > $OUT/bench70.txt
    if ! grep -q "^none" $OUT/bench70.txt; then
        ( echo "== 70B shape, $L70 of 80 layers, 32K, tp 2, full"; T=300 bench --random-weights $(cfg70 $L70) --tp 2 --lengths 32768 --gen 8 ) >> $OUT/bench70.txt
    fi
}
step_b70p() {
    for p in ${P70:-none gemfilter tokenselect}; do
        echo "== 70B shape, $L70P of 80 layers, 32K, tp 2, $p"
        x=; [ $p = tokenselect ] && x="--set tokenselect._memory_mb=8192 --set tokenselect._device_mb=4096"
        T=240 bench --random-weights $(cfg70 $L70P) --tp 2 --lengths 32768 --gen 8 --policy $p $x
    done >> $OUT/bench70p.txt
}
step_p8() { # the 8B shape at 32K with the policies, one GPU against two
    for tp in 1 2; do
        echo "== 8B 32K tp $tp policies"
        bench --random-weights $C8 --tp $tp --lengths 32768 --gen 16 --policy none,gemfilter,tokenselect
    done >> $OUT/bench8p.txt
}
for s in ${*:-check tests allreduce b8 b128 b70 p8 b70p}; do echo "== step $s $(date +%T)"; step_$s; done
rm -rf $B
echo "== end $(date +%T)"
grep -h "passed\|FAIL" $OUT/tests.txt 2>/dev/null | tail -12
grep -h "^ *\(1073741824\|268435456\|16777216\|1048576\|65536\|8192\) " $OUT/allreduce.txt 2>/dev/null
grep -h "^==\|^none\|^gemfilter\|^tokenselect\|rank\|rc=\|rror" $OUT/bench*.txt 2>/dev/null | tail -60
