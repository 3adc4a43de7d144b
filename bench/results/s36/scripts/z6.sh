# session 36, z6: the kept change's GPU tests (the joined step flat, the list attention behind a programmatic edge from a
# handler's last kernel): test_cuda_policies (stories260K not carried: the pack and the tree fill the 64 MiB), test_attn_list, and
# compute-sanitizer memcheck over the recorded TokenSelect and Quest cases
. bench/gpu_pack_env.sh
{ unset KS_STORIES; tst test_cuda_policies; tst test_attn_list
  for q in "handler in segments: tokenselect" "handler in segments: quest"; do echo "== memcheck test_cuda_policies --only '$q'"
    timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_policies --only "$q" 2>&1 | grep -v "^  ok" | tail -4; done
} > $O/tests.txt 2>&1
cat $O/tests.txt
