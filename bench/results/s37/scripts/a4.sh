# session 37, a4: the kept change's GPU tests (a recorded list attention prefetches the layer's o-projection into L2
# while it waits for the policy's top-k): test_attn_list, test_cuda_policies with stories260K, compute-sanitizer
# memcheck over the recorded TokenSelect and Quest cases
. bench/gpu_pack_env.sh
{
  tst test_cuda_policies
  for q in "handler in segments: tokenselect" "handler in segments: quest"; do echo "== memcheck test_cuda_policies --only '$q'"
    timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_policies --only "$q" 2>&1 | grep -v "^  ok" | tail -6; done
} > $O/tests.txt 2>&1
cat $O/tests.txt
