# session 40, c1: session 39's kept change (pk8 of s39: base = 40ad1b5, new = db279da) on an H200. TokenSelect beside full
# attention: three rounds at 32K, the hit path (cache_theta -1) at 32K, one round at 128K and of its hit path; then the
# device timeline of new's 32K decode (bench/ktrace.c).
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
run() { # run LABEL SECONDS ARGS...: base then new
  local l=$1 s=$2; shift 2
  for v in base new; do echo "== $v $l"
    KVSIEVE_POLICY_PATH=$R/$v/policies timeout $s $R/$v/kvsieve $B "$@" 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  done
}
{ for r in 1 2 3; do run "32K round $r" 60 --lengths 32768 --policy none,tokenselect --gen 32; done
  run "32K hit" 60 --lengths 32768 --policy none,tokenselect --set tokenselect.cache_theta=-1 --gen 32
  run "128K" 100 --lengths 131040 --policy none,tokenselect --gen 16
  run "128K hit" 100 --lengths 131040 --policy none,tokenselect --set tokenselect.cache_theta=-1 --gen 32
} > $O/tpot.txt 2>&1
cat $O/tpot.txt
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
echo "== new ts32" > $O/trace.txt
CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv KVSIEVE_POLICY_PATH=$R/new/policies timeout 60 \
  $R/new/kvsieve $B --gen 12 --policy tokenselect --lengths 32768 2>&1 | grep -E "^[a-z.]+ +[0-9]+ +[0-9.]+ |kvsieve:|ktrace" >> $O/trace.txt
python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -40 >> $O/trace.txt
cat $O/trace.txt
