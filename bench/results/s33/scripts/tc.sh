# session 33: make test-cuda's programs on the session's final library (fin = 51722e3's code), PATH-free, one by one
. bench/gpu_pack_env.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
run() { echo "== $*"; local b=$1; shift; timeout 280 $R/fin/$b "$@" 2>&1 | grep -v "^  ok" | grep -v "^  time" | tail -4; }
( run test_cuda; run test_cuda --quick --pdl; run test_cuda --quick --no-graphs; run test_cuda --mma-prefill
  run test_cuda_prims; run test_attn_decode_batch; run test_attn_list
  run test_gemm_rows; run test_tp_cuda; run test_wgmma ) > $O/tests.txt 2>&1
cat $O/tests.txt
