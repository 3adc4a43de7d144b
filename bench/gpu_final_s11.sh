# Session 11, the last GPU check: the CUDA tests of HEAD (stripped xz binaries carried in .data/final,
# .data/stories260K) and a 100K-token prompt through the CLI (-f FILE and -p - from stdin) on the
# bundled model with its context raised to 128K. Usage on the GPU machine: bash bench/gpu_final_s11.sh
T=$(mktemp -d); F=.data/final/run; mkdir -p $F; for f in .data/final/*.xz; do xz -dc $f > $F/$(basename $f .xz); done; chmod +x $F/*
export KS_STORIES=.data/stories260K
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/card.txt
( timeout 200 $F/test_cuda 2>&1 | grep -v "^  ok" | tail -8 ) > $OUT/test_cuda.txt
( timeout 60 $F/test_cuda_prims 2>&1 | tail -2 ) > $OUT/test_cuda_prims.txt
( timeout 90 $F/test_cuda_policies --stories .data/stories260K 2>&1 | tail -3 ) > $OUT/test_cuda_policies.txt
( timeout 60 $F/test_wgmma --quick 2>&1 | tail -4 ) > $OUT/test_wgmma_quick.txt
( timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 $F/test_cuda_policies --quick --stories .data/stories260K 2>&1 | tail -3; echo "rc=$?" ) > $OUT/san_policies.txt
# a 100K-token prompt through the CLI: the bundled model with its context raised (the prompt's length is what is tested)
M=$T/tiny128k; mkdir -p $M; cp models/kvsieve-tiny/*.json models/kvsieve-tiny/model.safetensors $M/
sed -i 's/"max_position_embeddings": 16384/"max_position_embeddings": 131072/' $M/config.json
python3 -c "print('The grass is green. The sky is blue. The sun is yellow. Here we go. ' * 5300)" > $T/p100k.txt
( echo "prompt tokens: $($F/kvsieve tokenize -m $M -f $T/p100k.txt | wc -w)"
  /usr/bin/time -f "wall %e s, maxrss %M KB" $F/kvsieve generate -m $M -f $T/p100k.txt -n 8 --backend cuda 2>&1 | tail -3
  /usr/bin/time -f "wall %e s, maxrss %M KB" $F/kvsieve generate -m $M -p - -n 8 --backend cuda --policy gemfilter --set layer=2 --set k=1024 < $T/p100k.txt 2>&1 | tail -3 ) > $OUT/prompt100k.txt 2>&1
tail -n 6 $OUT/*.txt
