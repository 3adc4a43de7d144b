# session 36, z10: the kept change's GPU tests (the joined step flat, the list attention behind a programmatic edge from a
# (z10: z6 again after the fix for empty recordings: cudaGraphGetNodes refuses an array for a graph of no nodes)
# handler's last kernel): test_cuda_policies with stories260K (test_attn_list passed in z6 with the same kernel), and
# compute-sanitizer memcheck over the recorded TokenSelect and Quest cases
. bench/gpu_pack_env.sh
{ tst test_cuda_policies
  for q in "handler in segments: tokenselect" "handler in segments: quest"; do echo "== memcheck test_cuda_policies --only '$q'"
    timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_policies --only "$q" 2>&1 | grep -v "^  ok" | tail -6; done
} > $O/tests.txt 2>&1
cat $O/tests.txt
