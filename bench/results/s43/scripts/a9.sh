# session 43, a9: new (G) = every warp checks the rope table's header itself, so a list's first tiles' table rows go
# out with their K and V copies in list_first (scripts/a9-table-early.diff), against F (57fcd63). GPU tests of G; then
# two rounds a build: the hit path at 128K beside full, TokenSelect at 32K beside full (bench's step_ms, TPOT).
. bench/gpu_pack_env.sh
{ tst test_attn_list; tst test_cuda --quick; tst test_cuda_policies; } > $O/tests.txt 2>&1
cat $O/tests.txt
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for r in 1 2; do for v in F new; do
  echo "== $v hit128 round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 131040 --gen 16 --policy none,tokenselect --set tokenselect.cache_theta=-1 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  echo "== $v 32K round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 32768 --gen 32 --policy none,tokenselect 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/rows.txt 2>&1
cat $O/rows.txt
