# session 41, c4: the top-k's pass counts sent over the cluster packed (four 16-bit or two 32-bit bins a 64-bit
# distributed-shared-memory add, instead of one 32-bit add a bin). base = c3597a8 (main), new = the change. New's
# top-k tests and their memcheck, TokenSelect's and Quest's sets against the CPU (test_cuda_policies, stories260K),
# bench_kernels --select of both (two rounds), then full attention beside TokenSelect at 32K (two rounds) and 128K.
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
{ tst test_cuda_prims --only topk
  echo "== memcheck test_cuda_prims --quick --only topk"
  timeout 250 compute-sanitizer --tool memcheck $R/new/test_cuda_prims --quick --only topk 2>&1 | tail -3
  echo "== racecheck test_cuda_prims --quick --only topk"
  timeout 250 compute-sanitizer --tool racecheck $R/new/test_cuda_prims --quick --only topk 2>&1 | tail -3
  tst test_cuda_policies
} > $O/tests.txt 2>&1
cat $O/tests.txt
for r in 1 2; do for v in base new; do echo "== $v round $r"; timeout 100 $R/$v/bench_kernels --select 2>&1 | grep -iE "topk|select"; done; done > $O/ks.txt 2>&1
cat $O/ks.txt
run() { # run LABEL SECONDS ARGS...: each build
  local l=$1 s=$2; shift 2
  for v in base new; do echo "== $v $l"
    KVSIEVE_POLICY_PATH=$R/$v/policies timeout $s $R/$v/kvsieve $B "$@" 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  done
}
{ for r in 1 2; do run "32K round $r" 60 --lengths 32768 --policy none,tokenselect --gen 32; done
  run "128K" 100 --lengths 131040 --policy none,tokenselect --gen 16
} > $O/tpot.txt 2>&1
cat $O/tpot.txt
