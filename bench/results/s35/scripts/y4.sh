# session 35, y4: g2 = g1 with the group sums' terms untested where every M_h of the group is finite (a masked key's
# term is +0 already): the same bits. Its GPU tests, the votes' bits beside base35, timelines (TokenSelect 32K
# and 128K, twice each)
. bench/gpu_pack_env.sh
cp -r $R/g2 $R/new
{ tst test_cuda_prims --only scores; tst test_cuda_prims --only grow; tst test_cuda_prims --only topk
  for v in base35 g2; do KVSIEVE_POLICY_PATH=$R/$v/policies timeout 120 $R/$v/kvsieve run bench/ts_vote_bits.lua cuda > $R/votes-$v.txt 2>&1; echo "$v: $(wc -c < $R/votes-$v.txt) bytes, md5 $(md5sum < $R/votes-$v.txt | cut -c1-12)"; done
  cmp $R/votes-base35.txt $R/votes-g2.txt && echo "votes: same bytes"
} > $O/tests.txt 2>&1
for c in "ts32:--lengths 32768 --policy tokenselect" "ts128:--lengths 131040 --policy tokenselect"; do for v in base35 g2 base35 g2; do
  n=${c%%:*}; a=${c#*:}
  echo "== $v $n"
  KVSIEVE_POLICY_PATH=$R/$v/policies CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 $a --gen 12 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -9; rm -f $R/t.csv
done; done > $O/trace.txt 2>&1
cat $O/tests.txt; grep -E "==|wall|sc1_logits|tk_clu|attn_|tokenselect" $O/trace.txt
