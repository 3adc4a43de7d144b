# session 36, z9: test_cuda_policies' recorded Quest cases with a debug build printing where a flat join's copy fails
. bench/gpu_pack_env.sh
unset KS_STORIES
$R/new/test_cuda_policies --only "handler in segments: quest" 2>&1 | grep -v "^  ok" | sort | uniq -c | sort -rn | head -20
