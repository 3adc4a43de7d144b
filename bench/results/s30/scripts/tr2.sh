. bench/gpu_pack_env.sh
for v in new; do
B="$R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
export KVSIEVE_POLICY_PATH=$R/$v/policies
echo "== $v quest128"
KS_DEBUG=1 CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$O/q.csv $B --lengths 131040 --gen 16 --policy quest --set quest.budget=4096 --json $O/q.json 2>&1 | grep -v '^ *$' | grep -i -E 'decode|record|replay|quest' | head -20
python3 bench/ktrace.py $O/q.csv --steps 12 --skip 0 --walls --host | head -40
grep -o '"replayed_layer_steps": *[0-9]*\|"graph_steps": *[0-9]*' $O/q.json
xz -9 $O/q.csv
done 2>&1 | tee $O/trace.txt
