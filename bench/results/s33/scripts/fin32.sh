# session 33: issue 14's table, its 8K / 32K rows (bench/gpu_s20.sh final32), then FastKV and full at 128K, two rounds (base33, n4)
export V="base33 n4"
bash bench/gpu_s20.sh final32
. bench/gpu_pack_env.sh
for r in 1 2; do for v in $V; do
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 250 $R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 --lengths 131040 --gen 16 --policy none,fastkv 2>&1 | grep -E "^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:" | sed "s/^/128K-fastkv $v: /"
done; done >> $O/final.txt
cat $O/final.txt
