# session 34: the scores kernel's prologue in finer stamps (q1ph2 = q1 + q1ph2.diff), TokenSelect 32K decode
. bench/gpu_pack_env.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
KVSIEVE_POLICY_PATH=$R/q1ph2/policies timeout 250 $R/q1ph2/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 --lengths 32768 --policy tokenselect --gen 40 > $O/sp32768.txt 2>&1
grep -c "^SP" $O/sp32768.txt; xz $O/sp32768.txt
