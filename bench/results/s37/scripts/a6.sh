# session 37, a6: new2 (the prefetch only where the list attention is recorded behind a decode handler's recording, not in
# held steps) beside new (04022cf: every recorded list attention) and base37. A timeline of TokenSelect at 32K for
# new2 (the o-projection's gemv), then the hit path (cache_theta -1) at 128K and 32K and TokenSelect at 32K, alternating.
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
{ echo "== new2 ts32 timeline"
  KVSIEVE_POLICY_PATH=$R/new2/policies CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $R/new2/kvsieve $B --lengths 32768 --policy tokenselect --gen 12 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:' | head -4
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -9; rm -f $R/t.csv; } > $O/trace.txt 2>&1
cat $O/trace.txt
for v in base37 new new2; do echo "== $v hit 128K"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 131040 --policy none,tokenselect --gen 32 --set tokenselect.cache_theta=-1 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done > $O/hit.txt 2>&1
for r in 1 2; do for v in base37 new new2; do echo "== $v 32K round $r"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 32768 --policy none,tokenselect --gen 32 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 32768 --policy tokenselect --gen 32 --set tokenselect.cache_theta=-1 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:' | sed 's/^tokenselect/ts-hit     /'
done; done >> $O/hit.txt 2>&1
cat $O/hit.txt
