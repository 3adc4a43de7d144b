#!/bin/bash
# m3: issue 14's table on 51a8dc5 (new: A2) beside base (839b1b1), one run of each row a build (bench/gpu_s20.sh
# final32 final128: step_ms and TPOT in ms); then compute-sanitizer memcheck and racecheck of new's test_attn_list
# --quick.
TAG=$TAG PK=$PK V="base new" bash bench/gpu_s20.sh final32 final128
. bench/gpu_pack_env.sh
{ timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_attn_list --quick 2>&1 | tail -3
  timeout 150 compute-sanitizer --tool racecheck --error-exitcode 1 $R/new/test_attn_list --quick 2>&1 | tail -3; } > $O/sanitize.txt 2>&1
cat $O/final.txt $O/sanitize.txt
