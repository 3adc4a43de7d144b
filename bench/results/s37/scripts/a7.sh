# session 37, a7: new = the prefetch set by the join where it gives the list attention its programmatic edge (behind a
# decode handler's last kernel; held steps and plain launches prefetch nothing). test_cuda_policies (stories260K not
# carried: its case is skipped) and memcheck of the recorded TokenSelect cases, a timeline of TokenSelect at 32K, then
# issue 14's table beside base37.
. bench/gpu_pack_env.sh
unset KS_STORIES
{ tst test_cuda_policies
  echo "== memcheck test_cuda_policies --only 'handler in segments: tokenselect'"
  timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $R/new/test_cuda_policies --only "handler in segments: tokenselect" 2>&1 | grep -v "^  ok" | tail -4
} > $O/tests.txt 2>&1
cat $O/tests.txt
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
{ echo "== new ts32 timeline"
  KVSIEVE_POLICY_PATH=$R/new/policies CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $R/new/kvsieve $B --lengths 32768 --policy tokenselect --gen 12 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:' | head -4
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -9; rm -f $R/t.csv; } > $O/trace.txt 2>&1
cat $O/trace.txt
