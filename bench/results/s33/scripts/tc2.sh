# session 33: the stories260K cases of test_cuda (its runs of make test-cuda) and test_tp_cuda, with the model carried (fin2 = fin's programs)
. bench/gpu_pack_env.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
run() { echo "== $*"; local b=$1; shift; timeout 280 $R/fin2/$b "$@" 2>&1 | grep -v "^  ok" | grep -v "^  time" | tail -4; }
( run test_cuda --only e2e; run test_cuda --quick --pdl --only e2e; run test_cuda --quick --no-graphs --only e2e
  run test_cuda --mma-prefill --only e2e; run test_tp_cuda ) > $O/tests.txt 2>&1
cat $O/tests.txt
