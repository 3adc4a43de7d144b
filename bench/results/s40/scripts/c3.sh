# session 40, c3: the plain recorded step (no decode handler) in three graphs cut at layers 1 and 4 (core/decode.c
# PLAIN_CUT; pk1: base = db279da, main's code before the session, new = the change). Tests of new (test_cuda --quick,
# test_cuda_policies with stories260K), the timeline of full attention at 32K (each build), then TPOT rounds beside
# TokenSelect: two at 32K (with the no-op handler), one at 128K and of the hit path at 128K.
. bench/gpu_pack_env.sh
{ tst test_cuda --quick; tst test_cuda_policies --stories .data/stories260K; } > $O/tests.txt 2>&1; cat $O/tests.txt
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
for v in base new; do echo "== $v full32"
  CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv KVSIEVE_POLICY_PATH=$R/$v/policies timeout 60 \
    $R/$v/kvsieve $B --gen 12 --lengths 32768 --policy none 2>&1 | grep -E "^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:|ktrace"
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -14; rm -f $R/t.csv
done > $O/trace.txt 2>&1
cat $O/trace.txt
run() { # run LABEL SECONDS ARGS...: base then new
  local l=$1 s=$2; shift 2
  for v in base new; do echo "== $v $l"
    KVSIEVE_POLICY_PATH=$R/$v/policies timeout $s $R/$v/kvsieve $B "$@" 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  done
}
{ for r in 1 2; do run "32K round $r" 80 --lengths 32768 --policy none,noop,tokenselect --gen 32; done
  run "128K" 100 --lengths 131040 --policy none,tokenselect --gen 16
  run "128K hit" 100 --lengths 131040 --policy none,tokenselect --set tokenselect.cache_theta=-1 --gen 32
} > $O/tpot.txt 2>&1
cat $O/tpot.txt
