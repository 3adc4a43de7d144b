. bench/gpu_pack_env.sh
for v in newc lazy; do
B="$R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
export KVSIEVE_POLICY_PATH=$R/$v/policies
echo "== $v"
CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$O/q.csv $B --lengths 131040 --gen 32 --policy quest --set quest.budget=4096 2>&1 | grep -E '^[a-z]+ +[0-9]+ '
python3 bench/ktrace.py $O/q.csv --steps 30 --skip 0 --walls 2>&1 | head -2; rm -f $O/q.csv
done 2>&1 | tee $O/walls.txt
V="newc lazy" bash bench/gpu_s20.sh q30
