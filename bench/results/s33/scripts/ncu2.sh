# session 33: the scores kernel (sc1_logits) and the top-k (tk_clu) of TokenSelect's 32K decode step under ncu (n4)
. bench/gpu_pack_env.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
for k in sc1_logits tk_clu; do
KVSIEVE_POLICY_PATH=$R/n4/policies timeout 300 ncu --clock-control none -k regex:$k --launch-skip 2100 --launch-count 1 --set full --import-source no -o $O/$k \
  $R/n4/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 --lengths 32768 --policy tokenselect --gen 12 > $O/ncu-run-$k.txt 2>&1
ncu -i $O/$k.ncu-rep --page details > $O/details-$k.txt 2>&1
ncu -i $O/$k.ncu-rep --page source --csv --print-source sass > $O/sass-$k.csv 2>&1
rm -f $O/$k.ncu-rep
done
grep -E "Duration|Warp Cycles Per Issued|Executed Instructions  |Registers Per|Grid Size|Block Size" $O/details-*.txt
