# session 36, z8: what cudaGraphGetNodes / GetEdges return for an empty stream capture: scripts/empty.cu, built here with
# `nvcc -O2 -arch=sm_90a bench/results/s36/scripts/empty.cu -o .data/s36/t/empty` and carried
export LD_LIBRARY_PATH=/usr/local/cuda/lib64; .data/s36/t/empty; compute-sanitizer .data/s36/t/empty 2>&1 | grep -E "hit|SUMMARY"
