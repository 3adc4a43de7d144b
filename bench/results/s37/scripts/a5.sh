# session 37, a5: base37 beside new (04022cf: a recorded list attention prefetches all of the layer's o-projection into
# L2 while it waits for the policy's top-k) and p70 (the same, 70% of it). TPOT rounds at 32K beside full attention,
# alternating, four rounds, no tracer.
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for r in 1 2 3 4; do for v in base37 new p70; do echo "== $v 32K round $r"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 32768 --policy none,tokenselect --gen 32 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/r32.txt 2>&1
cat $O/r32.txt
