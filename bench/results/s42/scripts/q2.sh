# session 42, q2: ncu of Quest's bound kernel (base = main) in bench_kernels --quest at 128K: the sections
# that say what it waits on, and its SASS with per-instruction samples (--page source).
. bench/gpu_pack_env.sh
N=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
cd $R/base
timeout 400 $N --kernel-name regex:bound_scores_warp --launch-skip 170 --launch-count 1 --set full --import-source no -o $O/bound ./bench_kernels --quest > $O/ncu-run.txt 2>&1
$N -i $O/bound.ncu-rep --page details > $O/details.txt 2>&1
$N -i $O/bound.ncu-rep --page source --csv --print-source sass > $O/sass.csv 2>&1
rm -f $O/bound.ncu-rep
tail -3 $O/ncu-run.txt; grep -E "Duration|Registers|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Stall|DRAM Throughput|Compute \(SM\)" $O/details.txt | head -40
wc -l $O/sass.csv
