# The CUDA tests after the split of kernels/cuda_backend.cu into kernels/cuda_*.cu (issue 13), and
# greedy outputs of the new kvsieve next to HEAD's (before the split) on the same card. Stripped
# xz binaries carried in .data/split (new) and .data/split/old (HEAD's kvsieve), the model in
# .data/stories260K. Usage on the GPU machine: bash bench/results/h100-s11-cudasplit/run.sh
W=$(mktemp -d); S=.data/split; R=$S/run; mkdir -p $R/old
for f in $S/*.xz; do xz -dc $f > $R/$(basename $f .xz); done
xz -dc $S/old/kvsieve.xz > $R/old/kvsieve; chmod +x $R/* $R/old/*
export KS_STORIES=.data/stories260K
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/card.txt
( timeout 200 $R/test_cuda 2>&1 | grep -v "^  ok" | tail -8 ) > $OUT/test_cuda.txt
( timeout 60 $R/test_cuda_prims 2>&1 | tail -2 ) > $OUT/test_cuda_prims.txt
( timeout 90 $R/test_cuda_policies --stories .data/stories260K 2>&1 | tail -3 ) > $OUT/test_cuda_policies.txt
( for a in "--quick --pdl" "--quick --no-graphs" "--mma-prefill"; do echo "test_cuda $a:"; timeout 150 $R/test_cuda $a 2>&1 | tail -1; done ) > $OUT/test_cuda_variants.txt
# the same greedy runs through HEAD's binary and the split one: decode (graphs), a prefill of
# about 2,000 tokens (the prefill attention planner), a policy, the stories model
python3 -c "print('The grass is green. The sky is blue. The sun is yellow. Here we go. ' * 120)" > $W/p2k.txt
T=models/kvsieve-tiny; M=.data/stories260K
run() { $1 generate -m $T -p "Once upon a time" -n 48 --backend cuda
        $1 generate -m $T -f $W/p2k.txt -n 32 --backend cuda
        $1 generate -m $T -f $W/p2k.txt -n 32 --backend cuda --policy gemfilter --set layer=2 --set k=128
        $1 generate -m $T -f $W/p2k.txt -n 32 --backend cuda --policy streamingllm
        $1 generate -m $M -p "Once upon a time" -n 64 --backend cuda; }
run $R/old/kvsieve > $W/old.txt 2>$W/old.err; run $R/kvsieve > $W/new.txt 2>$W/new.err
( echo "HEAD vs split, greedy text of 5 runs: $(cmp -s $W/old.txt $W/new.txt && echo identical || echo DIFFERENT) ($(wc -c < $W/new.txt) bytes)"
  diff $W/old.txt $W/new.txt | head -20; echo "--- timing lines (HEAD, then split)"; cat $W/old.err $W/new.err ) > $OUT/compare.txt
tail -n 12 $OUT/*.txt
