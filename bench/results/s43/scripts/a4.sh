# session 43, a4: new (E2) = a3's E with the query's first values loaded before the wait and the rows' lookups issued before the query is staged
# (scripts/a4-early2.diff) against base (main, 722409d). GPU tests of E2; the list attention's phases in the hit path
# at 128K (ph2 = E2 with a2-phases.diff); then two rounds a build: full and TokenSelect at 32K, full, TokenSelect and
# Quest at 128K, the hit path at 128K (bench's step_ms, TPOT).
. bench/gpu_pack_env.sh
{ tst test_attn_list; tst test_cuda --quick; tst test_cuda_policies; } > $O/tests.txt 2>&1
cat $O/tests.txt
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
KVSIEVE_POLICY_PATH=$R/ph2/policies timeout 120 $R/ph2/kvsieve $B --lengths 131040 --gen 24 --policy tokenselect --set tokenselect.cache_theta=-1 > $O/ph-hit.txt 2>&1
grep -c "^PH" $O/ph-hit.txt; python3 bench/results/s43/scripts/ph2.py $O/ph-hit.txt | head -12
for r in 1 2; do for v in base new; do
  echo "== $v 32K round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 32768 --gen 32 --policy none,tokenselect 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  echo "== $v 128K round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 131040 --gen 16 --policy none,tokenselect,quest --set quest.budget=4096 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  echo "== $v hit128 round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 131040 --gen 16 --policy tokenselect --set tokenselect.cache_theta=-1 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/rows.txt 2>&1
cat $O/rows.txt
