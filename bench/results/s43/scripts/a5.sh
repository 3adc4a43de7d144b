# session 43, a5: new (F) = the list attention's first tiles looked up and their K / V copies issued before the query
# is staged, except where its blocks start behind a decode handler's last kernel (ks_cuda_attn_params.behind, set by
# the join with the programmatic edge), which stage the query first as before (scripts/a5-first-early.diff); base =
# main (722409d). GPU tests of F; the list attention's phases (ph3 = F with a2-phases.diff) in the hit path at 128K and
# in TokenSelect's default at 32K; then two rounds a build: full and TokenSelect at 32K, full, TokenSelect and Quest at
# 128K, the hit path at 128K (bench's step_ms, TPOT).
. bench/gpu_pack_env.sh
{ tst test_attn_list; tst test_cuda --quick; tst test_cuda_policies; } > $O/tests.txt 2>&1
cat $O/tests.txt
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
KVSIEVE_POLICY_PATH=$R/ph3/policies timeout 120 $R/ph3/kvsieve $B --lengths 131040 --gen 24 --policy tokenselect --set tokenselect.cache_theta=-1 > $O/ph-hit.txt 2>&1
grep -c "^PH" $O/ph-hit.txt; python3 bench/results/s43/scripts/ph2.py $O/ph-hit.txt > $O/ph-hit-phases.txt; head -12 $O/ph-hit-phases.txt
KVSIEVE_POLICY_PATH=$R/ph3/policies timeout 120 $R/ph3/kvsieve $B --lengths 32768 --gen 24 --policy tokenselect > $O/ph-ts32.txt 2>&1
grep -c "^PH" $O/ph-ts32.txt; python3 bench/results/s43/scripts/ph2.py $O/ph-ts32.txt > $O/ph-ts32-phases.txt; head -12 $O/ph-ts32-phases.txt
for r in 1 2; do for v in base new; do
  echo "== $v 32K round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 32768 --gen 32 --policy none,tokenselect 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  echo "== $v 128K round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 131040 --gen 16 --policy none,tokenselect,quest --set quest.budget=4096 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  echo "== $v hit128 round $r"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 131040 --gen 16 --policy tokenselect --set tokenselect.cache_theta=-1 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/rows.txt 2>&1
cat $O/rows.txt
rm -f $O/ph-hit.txt $O/ph-ts32.txt
