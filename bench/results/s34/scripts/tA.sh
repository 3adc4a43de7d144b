# session 34: GPU tests of the scores kernel change (q1 = 1st commit of the session): test_cuda_prims, test_cuda_policies
# with stories260K, memcheck of test_cuda_prims --quick --only scores
. bench/gpu_pack_env.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
cp -r $R/q1t $R/new
{ tst test_cuda_prims; tst test_cuda_policies --stories .data/stories260K
  echo "== memcheck test_cuda_prims --quick --only scores"
  timeout 250 /usr/local/cuda/bin/compute-sanitizer --tool memcheck $R/new/test_cuda_prims --quick --only scores 2>&1 | tail -3; } > $O/tests.txt 2>&1
cat $O/tests.txt
