# session 35: GPU tests of the kept build (420a16d: the scores kernel's group sums): test_cuda_prims, test_cuda_policies
# with stories260K, memcheck of test_cuda_prims --quick --only scores (pack: that build's two test programs as new/)
. bench/gpu_pack_env.sh
{ tst test_cuda_prims; tst test_cuda_policies --stories .data/stories260K
  echo "== memcheck test_cuda_prims --quick --only scores"
  timeout 200 /usr/local/cuda/bin/compute-sanitizer --tool memcheck $R/new/test_cuda_prims --quick --only scores 2>&1 | tail -3; } > $O/tests.txt 2>&1
cat $O/tests.txt
