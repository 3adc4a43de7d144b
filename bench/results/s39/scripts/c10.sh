# session 39, c10: c8's new build (pk8) on the same warm machine: test_cuda_policies with stories260K, and the memcheck
# of test_attn_list.
. bench/gpu_pack_env.sh
{ tst test_cuda_policies
  echo "== memcheck test_attn_list"
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_attn_list 2>&1 | grep -v "^  ok" | tail -4
} > $O/tests.txt 2>&1; cat $O/tests.txt
