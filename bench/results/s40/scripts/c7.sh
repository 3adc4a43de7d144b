# session 40, c7: main's build at the session's end (pk4 new = 06668d1: kernels as db279da, bench's step_ms): GPU tests
# (test_cuda --quick, test_cuda_prims, test_cuda_policies with stories260K, test_attn_list), then issue 14's table once
# more (bench/gpu_s20.sh final32 final128, V=new).
. bench/gpu_pack_env.sh
{ tst test_cuda --quick; tst test_cuda_prims; tst test_cuda_policies --stories .data/stories260K; tst test_attn_list; } > $O/tests.txt 2>&1
cat $O/tests.txt
V=new bash bench/gpu_s20.sh final32 final128
cat $O/final.txt
