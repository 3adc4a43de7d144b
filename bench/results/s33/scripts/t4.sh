# session 33: the list attention's lean copies (n4 = the kept build): its GPU tests, then TPOT rounds beside main (base33)
. bench/gpu_pack_env.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
( echo "== test_attn_list"; timeout 250 $R/n4/test_attn_list 2>&1 | grep -v "^  ok" | tail -4
  echo "== test_cuda_policies --stories"; timeout 200 $R/n4/test_cuda_policies --stories .data/stories260K 2>&1 | grep -v "^  ok" | tail -3
  echo "== test_cuda --quick"; timeout 250 $R/n4/test_cuda --quick 2>&1 | grep -v "^  ok" | tail -3
  echo "== memcheck test_attn_list --quick"; timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $R/n4/test_attn_list --quick 2>&1 | tail -3
) > $O/tests.txt 2>&1
cat $O/tests.txt
for r in 1 2; do for v in base33 n4; do
  B="$R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 200 $B --lengths 32768 --gen 32 --policy none,tokenselect 2>&1 | grep -E '^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:' | sed "s/^/32K $v: /"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 200 $B --lengths 131040 --gen 16 --policy none,tokenselect 2>&1 | grep -E '^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:' | sed "s/^/128K $v: /"
done; done > $O/ab.txt 2>&1
cat $O/ab.txt
