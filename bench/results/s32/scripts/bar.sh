# session 32: the scores kernel's grid barriers as one monotonic counter with acquire polls (vS) against
# main's (vBase): the scores tests and their memcheck / racecheck, bench_kernels --select, TokenSelect's
# timelines and TPOT rounds beside full
. bench/gpu_pack_env.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
( for o in scores grow; do echo "== test_cuda_prims --only $o"; timeout 250 $R/vS/test_cuda_prims --only $o 2>&1 | grep -v "^  ok" | tail -4; done
  echo "== memcheck"; timeout 250 compute-sanitizer --tool memcheck --error-exitcode 1 $R/vS/test_cuda_prims --quick --only scores 2>&1 | tail -3
  echo "== racecheck"; timeout 250 compute-sanitizer --tool racecheck --error-exitcode 1 $R/vS/test_cuda_prims --quick --only scores 2>&1 | tail -3
) > $O/tests.txt 2>&1
for r in 1 2; do for v in vBase vS; do echo "== $v"; timeout 200 $R/$v/bench_kernels --select 2>&1 | grep -E "select:"; done; done > $O/ks.txt 2>&1
for c in "ts128:--lengths 131040 --policy tokenselect" "ts32:--lengths 32768 --policy tokenselect"; do for v in vBase vS; do
  n=${c%%:*}; a=${c#*:}
  echo "== $v $n"
  KS_CUDA_WPF=0 KVSIEVE_POLICY_PATH=$R/$v/policies CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 $a --gen 12 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -24; rm -f $R/t.csv
done; done > $O/trace.txt 2>&1
for r in 1 2; do for v in vBase vS; do
  B="$R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
  KS_CUDA_WPF=0 KVSIEVE_POLICY_PATH=$R/$v/policies timeout 200 $B --lengths 32768 --gen 32 --policy none,tokenselect 2>&1 | grep -E '^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:' | sed "s/^/32K $v: /"
  KS_CUDA_WPF=0 KVSIEVE_POLICY_PATH=$R/$v/policies timeout 200 $B --lengths 131040 --gen 16 --policy none,tokenselect 2>&1 | grep -E '^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:' | sed "s/^/128K $v: /"
done; done > $O/ab.txt 2>&1
