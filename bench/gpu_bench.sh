# The speed benchmark of issue #5 in ONE device call (GPU machine, repo root): HF transformers
# (SDPA, default and cuDNN backends) and kvsieve on the same Llama-3.1-8B config with random bf16
# weights, then the side-by-side table. Binaries come packed in .data/bins.tar.xz (see bench/NOTES.md).
set -x
B=.data/run; mkdir -p $B && tar -C $B -xJf .data/bins.tar.xz
CFG=bench/configs/llama-3.1-8b.json
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
python3 tools/hf_bench.py --config $CFG --lengths 8192,32768,131072 --json $OUT/hf_default.json > $OUT/hf_default.txt 2>&1
python3 tools/hf_bench.py --config $CFG --lengths 8192,32768,131072 --sdpa-backend cudnn --json $OUT/hf_cudnn.json > $OUT/hf_cudnn.txt 2>&1
tail -5 $OUT/hf_default.txt $OUT/hf_cudnn.txt
# headline figures without the profiler (its event marks cost a little), then the same with it
$B/kvsieve bench --random-weights $CFG --backend cuda --lengths 8192,32768,131040 --gen 32 --repeat 1 \
    --policy none,gemfilter,fastkv --set gemfilter.layer=13 --set gemfilter.k=1024 --set fastkv.tsp_layer=15 > $OUT/ours.txt 2>&1
$B/kvsieve bench --random-weights $CFG --backend cuda --lengths 32768 --gen 64 --repeat 2 \
    --policy snapkv,gemfilter,streamingllm --set snapkv.budget=2048 --set gemfilter.k=2048 --set streamingllm.budget=2048 > $OUT/ours_budget.txt 2>&1
$B/kvsieve bench --random-weights $CFG --backend cuda --lengths 8192,32768,131056 --gen 16 --repeat 1 --profile \
    --policy none,gemfilter,fastkv --set gemfilter.layer=13 --set gemfilter.k=1024 --set fastkv.tsp_layer=15 > $OUT/ours_profile.txt 2>&1
python3 tools/bench_compare.py $OUT/ours.txt $OUT/hf_default.json $OUT/hf_cudnn.json | tee $OUT/side_by_side.txt
grep -v "^  " $OUT/ours_profile.txt | grep "^rates"; grep "^none\|^snapkv\|^gemfilter\|^streaming" $OUT/ours_budget.txt
