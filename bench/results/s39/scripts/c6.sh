# session 39, c6: the o- and down projections' gemv (gemv_kernel) in the 32K decode step under ncu, TokenSelect (its
# list attention prefetches the o-projection into L2) and full attention, main's build (base): DRAM bytes read and
# device time of four consecutive launches (two layers) in a steady step. --cache-control none keeps the L2 as the
# step left it; ncu runs kernels one at a time, so the prefetch has finished before the gemv starts.
. bench/gpu_pack_env.sh
for pol in tokenselect none; do
  echo "== $pol"
  KVSIEVE_POLICY_PATH=$R/base/policies timeout 250 ncu --clock-control none --cache-control none -k regex:gemv_kernel \
    --launch-skip 390 --launch-count 4 --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \
    $R/base/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 --lengths 32768 \
    --policy $pol --gen 10 2>&1 | grep -E "gemv_kernel|gpu__time|dram__bytes|grid_size|==PROF==|ERR" | head -24
done > $O/ncu.txt 2>&1
cat $O/ncu.txt
