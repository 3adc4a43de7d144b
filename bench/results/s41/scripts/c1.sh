# session 41, c1: does the o-projection's L2 prefetch pay on an H200? base = c3597a8 (main), nopf = the same with the
# joined step's prefetch left unset (scripts/c1-nopf.diff). TPOT and step_ms of full attention beside TokenSelect at
# 32K (two rounds), its hit path at 32K and 128K, and TokenSelect at 128K, each build; then ncu of the gemv after the
# attention (o-projection, down projection) in TokenSelect's and full attention's 32K step (as session 39's c6), and
# one layer's kernels in a steady step of each (bench/ktrace.c, --seq).
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
run() { # run LABEL SECONDS ARGS...: each build
  local l=$1 s=$2; shift 2
  for v in base nopf; do echo "== $v $l"
    KVSIEVE_POLICY_PATH=$R/$v/policies timeout $s $R/$v/kvsieve $B "$@" 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  done
}
{ for r in 1 2; do run "32K round $r" 60 --lengths 32768 --policy none,tokenselect --gen 32; done
  run "32K hit" 60 --lengths 32768 --policy tokenselect --set tokenselect.cache_theta=-1 --gen 32
  run "128K" 100 --lengths 131040 --policy none,tokenselect --gen 16
  run "128K hit" 60 --lengths 131040 --policy tokenselect --set tokenselect.cache_theta=-1 --gen 16
} > $O/tpot.txt 2>&1
cat $O/tpot.txt
for v in base nopf; do for pol in tokenselect none; do
  [ $v = nopf ] && [ $pol = none ] && continue
  echo "== $v $pol"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 100 ncu --clock-control none --cache-control none -k regex:gemv_kernel \
    --launch-skip 390 --launch-count 4 --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \
    $R/$v/kvsieve $B --lengths 32768 --policy $pol --gen 10 2>&1 | grep -E "gpu__time|dram__bytes|grid_size|ERR" | head -24
done; done > $O/ncu.txt 2>&1
cat $O/ncu.txt
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
for pol in tokenselect none; do
  echo "== base $pol" >> $O/trace.txt
  CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv KVSIEVE_POLICY_PATH=$R/base/policies timeout 60 \
    $R/base/kvsieve $B --gen 12 --policy $pol --lengths 32768 2>&1 | grep -E "kvsieve:|ktrace" >> $O/trace.txt
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 --seq 40 2>&1 | head -70 >> $O/trace.txt
done
cat $O/trace.txt
