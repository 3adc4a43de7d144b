# session 36, z7: compute-sanitizer memcheck over test_cuda_policies' recorded Quest cases, the whole report (z6 printed
# its tail only: 44 errors)
. bench/gpu_pack_env.sh
unset KS_STORIES
timeout 250 compute-sanitizer --tool memcheck $R/new/test_cuda_policies --only "handler in segments: quest" > $O/memcheck-quest.txt 2>&1
grep -c "=========" $O/memcheck-quest.txt; grep -v "^  ok" $O/memcheck-quest.txt | head -60
