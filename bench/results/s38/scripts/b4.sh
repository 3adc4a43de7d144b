# session 38, b4: the kept change's GPU tests (new = one tile a list warp over the rope table, the ranges' blocks not
# waiting for the top-k, a combine of 16 warps with scalar columns where head_dim % 4 != 0): test_attn_list,
# test_cuda --quick, test_cuda_policies with stories260K, compute-sanitizer memcheck over the recorded TokenSelect and
# Quest cases and test_cuda --quick's attention cases. Then issue 14's table (bench/gpu_s20.sh final128 final32).
. bench/gpu_pack_env.sh
{
  tst test_attn_list; tst test_cuda --quick; tst test_cuda_policies
  for q in "handler in segments: tokenselect" "handler in segments: quest"; do echo "== memcheck test_cuda_policies --only '$q'"
    timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_policies --only "$q" 2>&1 | grep -v "^  ok" | tail -6; done
} > $O/tests.txt 2>&1
cat $O/tests.txt
