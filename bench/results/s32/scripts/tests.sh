# session 32: the GPU tests of the session's library (new = 601d81f's code): test_cuda_prims (all),
# test_cuda_policies with stories260K, test_cuda --quick, test_attn_list --quick, memcheck of
# test_cuda_prims --quick
. bench/gpu_pack_env.sh
( tst test_cuda_prims; tst test_cuda_policies; tst test_cuda --quick; tst test_attn_list --quick
  echo "== memcheck test_cuda_prims --quick"
  timeout 280 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_prims --quick 2>&1 | tail -2
) > $O/tests.txt 2>&1
