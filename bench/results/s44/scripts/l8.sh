#!/bin/bash
# l8: issue 14's table on 5b03dac (new: T, with test_cuda_prims' new grow-under-mask test) beside base (0b84645),
# one run of each row a build (bench/gpu_s20.sh final32 final128: step_ms and TPOT in ms); then new's tests
# (test_cuda_prims --only grow, test_attn_list) and compute-sanitizer memcheck and racecheck of new's
# test_attn_list --quick.
TAG=$TAG PK=$PK V="base new" bash bench/gpu_s20.sh final32 final128
. bench/gpu_pack_env.sh
{ tst test_cuda_prims --only grow; tst test_attn_list
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_attn_list --quick 2>&1 | tail -3
  timeout 150 compute-sanitizer --tool racecheck --error-exitcode 1 $R/new/test_attn_list --quick 2>&1 | tail -3; } > $O/sanitize.txt 2>&1
cat $O/final.txt $O/sanitize.txt
