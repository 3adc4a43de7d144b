# session 33: the list attention's phases inside TokenSelect's decode step (32K), printf stamps
. bench/gpu_pack_env.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
KVSIEVE_POLICY_PATH=$R/ph/policies timeout 200 $R/ph/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 --lengths 32768 --policy tokenselect --gen 48 > $O/ph32.txt 2>&1
grep -c "^PH" $O/ph32.txt
KVSIEVE_POLICY_PATH=$R/base33/policies CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $R/base33/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 --lengths 32768 --policy tokenselect --gen 12 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:' > $O/trace32.txt
python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 >> $O/trace32.txt 2>&1
cp $R/t.csv $O/t32.csv; xz $O/t32.csv
