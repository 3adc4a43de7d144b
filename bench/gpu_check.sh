# A quick check on the GPU machine (repo root): parity tests (quick) and the headline end-to-end
# figures without the profiler. Binaries from .data/bins.tar.xz (kvsieve, test_cuda,
# test_cuda_policies; see bench/NOTES.md). Usage: bash bench/gpu_check.sh
B=.data/run; mkdir -p $B && tar -C $B -xJf .data/bins.tar.xz
export KS_STORIES=.data/stories260K
CFG=bench/configs/llama-3.1-8b.json
( $B/test_cuda --quick 2>&1 | tail -1; $B/test_cuda --quick --pdl 2>&1 | tail -1 ) > $OUT/t_quick.txt 2>&1
[ -x $B/test_cuda_policies ] && ( $B/test_cuda_policies --quick --stories .data/stories260K 2>&1 | tail -1 ) >> $OUT/t_quick.txt 2>&1
$B/kvsieve bench --random-weights $CFG --backend cuda --lengths 131040 --gen 32 --repeat 1 --policy none,gemfilter,fastkv \
    --set gemfilter.layer=13 --set gemfilter.k=1024 --set fastkv.tsp_layer=15 > $OUT/e2e_128k.txt 2>&1
$B/kvsieve bench --random-weights $CFG --backend cuda --lengths 32768 --gen 64 --repeat 2 --policy none,snapkv,gemfilter \
    --set snapkv.budget=2048 --set gemfilter.k=2048 > $OUT/e2e_32k.txt 2>&1
cat $OUT/t_quick.txt; grep -E "^none|^snap|^gem|^fastkv|^rates" $OUT/e2e_*.txt
