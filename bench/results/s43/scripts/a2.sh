# session 43, a2: (1) the list attention's phases in TokenSelect's hit path (cache_theta -1) and in Quest at 128K:
# ph = main (722409d) with scripts/a2-phases.diff (session 41's %globaltimer stamps of the list attention; thread 0 of
# every block prints its stamps for layers 4-7 of list calls 8-21). (2) ncu's SASS of Quest's bound kernel at 128K
# (bench_kernels --quest), base and a1's M, executed instructions by opcode.
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
KVSIEVE_POLICY_PATH=$R/ph/policies timeout 120 $R/ph/kvsieve $B --lengths 131040 --gen 24 --policy tokenselect --set tokenselect.cache_theta=-1 > $O/ph-hit.txt 2>&1
grep -c "^PH" $O/ph-hit.txt; grep -E "^tokenselect|kvsieve:" $O/ph-hit.txt
KVSIEVE_POLICY_PATH=$R/ph/policies timeout 120 $R/ph/kvsieve $B --lengths 131040 --gen 24 --policy quest --set quest.budget=4096 > $O/ph-quest.txt 2>&1
grep -c "^PH" $O/ph-quest.txt; grep -E "^quest|kvsieve:" $O/ph-quest.txt
N=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
for v in base M; do
  ( cd $R/$v && timeout 200 $N --kernel-name regex:bound_scores_warp --launch-skip 170 --launch-count 1 --set full --import-source no -o $O/bound-$v ./bench_kernels --quest > $O/ncu-run-$v.txt 2>&1 )
  $N -i $O/bound-$v.ncu-rep --page details > $O/details-$v.txt 2>&1
  $N -i $O/bound-$v.ncu-rep --page source --csv --print-source sass > $O/sass-$v.csv 2>&1
  rm -f $O/bound-$v.ncu-rep
  grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Ipc A|Warp Cycles Per Issued|DRAM Throughput|Instructions" $O/details-$v.txt | head -12
done
xz -9 $O/sass-*.csv
