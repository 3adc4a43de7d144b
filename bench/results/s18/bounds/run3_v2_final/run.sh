# bound_scores device call: tests + memcheck, bench base/new alternated twice, variants, ncu (4 files)
R=$(mktemp -d); O="$OUT/bounds"; mkdir -p $O
xz -dc .data/s18/bs/pk.tar.xz | tar xf - -C $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_VISIBLE_DEVICES=0
T=$O/tests.txt; B=$O/bench.txt; V=$O/variants.txt; N=$O/ncu.txt
{ echo "== card"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $T
{ echo "== new/test_cuda_prims --only bound"; cd $R && timeout 120 ./new/test_cuda_prims --only bound; echo "rc=$?"; } >> $T 2>&1
{ echo "== new/test_cuda_prims --only page"; cd $R && timeout 60 ./new/test_cuda_prims --only page; echo "rc=$?"; } >> $T 2>&1
for i in 1 2; do for v in base new; do
  { echo "== $v/bench_kernels --quest (round $i)"; cd $R && timeout 60 ./$v/bench_kernels --quest; echo "rc=$?"; } >> $B 2>&1
done; done
for e in "KS_BSF_PF=0" "KS_BSF_PF=1" "KS_BSF_PF=2" "KS_BSF_PF=3" "KS_BSF_PF=4" "KS_BSF_PF=2 KS_BSF_WIDE=0" "KS_BSF_PF=0"; do
  { echo "== $e new/bench_kernels --quest"; cd $R && env $e timeout 60 ./new/bench_kernels --quest | grep "quest:"; } >> $V 2>&1
done
{ echo "== compute-sanitizer --tool memcheck new/test_cuda_prims --only bound"; cd $R && timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 ./new/test_cuda_prims --only bound 2>&1 | tail -4; echo "rc=${PIPESTATUS[0]}"; } >> $T 2>&1
if command -v ncu >/dev/null; then for p in 0 2 3; do
  { echo "== ncu KS_BSF_PF=$p (a 128K launch)"; cd $R && KS_BSF_PF=$p timeout 60 ncu --cache-control none --clock-control none -k regex:bound_scores --launch-skip 60 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy ./new/bench_kernels --quest 2>&1 | grep -v "^==PROF" | sed -n '/bound_scores_fast/,$p' | grep -v "^    ---\|^    Metric Name\|^$" ; } >> $N 2>&1
done; fi
grep -h "FAIL\|passed\|ERROR SUMMARY\|== card" -A0 $T; grep -h "bound_scores\|^==" $B $V
