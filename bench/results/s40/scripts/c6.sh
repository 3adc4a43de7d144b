# session 40, c6: how many graphs a replayed step is, in the steady state (bench's step_ms, the median step). pk3:
# base = 06668d1 (main: the plain step one graph, a recorded handler's step three, held steps two); one = every joined
# step one graph (scripts/c6-one-graph.diff: HJOIN_CUT and JOIN_HEAD); cut3 = the plain step three graphs
# (scripts/c3-plain-cut.diff). Full attention beside TokenSelect at 32K (two rounds) and at 128K, and the hit path
# (cache_theta -1, held steps) at 32K and 128K.
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
run() { # run LABEL SECONDS ARGS...: each build
  local l=$1 s=$2; shift 2
  for v in base one cut3; do echo "== $v $l"
    KVSIEVE_POLICY_PATH=$R/$v/policies timeout $s $R/$v/kvsieve $B "$@" 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  done
}
{ for r in 1 2; do run "32K round $r" 80 --lengths 32768 --policy none,tokenselect --gen 32; done
  run "32K hit" 80 --lengths 32768 --policy none,tokenselect --set tokenselect.cache_theta=-1 --gen 32
  run "128K" 100 --lengths 131040 --policy none,tokenselect --gen 16
  run "128K hit" 100 --lengths 131040 --policy tokenselect --set tokenselect.cache_theta=-1 --gen 32
} > $O/tpot.txt 2>&1
cat $O/tpot.txt
