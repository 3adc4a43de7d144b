. bench/gpu_pack_env.sh
# tk_clu's launches of bench_kernels --select under ncu: durations of the first 60, then the full set of
# sections (warp states, source counters) for one 32K row (16 x 256) and one 128K row (16 x 1024)
timeout 250 ncu --clock-control none -k regex:tk_clu --launch-count 60 --section SpeedOfLight $R/new/bench_kernels --select 2>&1 |
    grep -E "tk_clu|Duration|Block Size|Grid Size" > $O/ncu-dur.txt
for skip in 0 30; do
  timeout 250 ncu --clock-control none -k regex:tk_clu --launch-skip $skip --launch-count 1 --set full --import-source no \
      $R/new/bench_kernels --select > $O/ncu-full-$skip.txt 2>&1
done
