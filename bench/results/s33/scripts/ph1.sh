# session 33: n1's list attention: phases (ph1, printf stamps) and ncu in TokenSelect's 32K decode step
. bench/gpu_pack_env.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
KVSIEVE_POLICY_PATH=$R/ph1/policies timeout 200 $R/ph1/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 --lengths 32768 --policy tokenselect --gen 48 > $O/ph32.txt 2>&1
KVSIEVE_POLICY_PATH=$R/n1/policies timeout 400 ncu --clock-control none -k regex:attn_decode_tc --launch-skip 200 --launch-count 1 --set full --import-source no -o $O/att \
  $R/n1/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 --lengths 32768 --policy tokenselect --gen 12 > $O/ncu-run.txt 2>&1
ncu -i $O/att.ncu-rep --page details > $O/details.txt 2>&1
ncu -i $O/att.ncu-rep --page source --csv --print-source sass > $O/sass.csv 2>&1
rm -f $O/att.ncu-rep
