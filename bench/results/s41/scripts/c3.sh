# session 41, c3: how much of the o-projection to prefetch into L2 on an H200. pff = main (c3597a8) with the joined
# step's prefetch cut to the fraction KS_PF_FRAC of the matrix (scripts/c3-pf-frac.diff; 1 = main, 0 = none). Full
# attention beside TokenSelect at 32K (two rounds) and 128K, TPOT and step_ms, for each fraction.
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
run() { # run LABEL SECONDS ARGS...: each fraction
  local l=$1 s=$2; shift 2
  for f in 1 0 0.2 0.35 0.5 0.7; do echo "== pf $f $l"
    KS_PF_FRAC=$f KVSIEVE_POLICY_PATH=$R/pff/policies timeout $s $R/pff/kvsieve $B "$@" 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  done
}
{ run "32K round 1" 60 --lengths 32768 --policy none,tokenselect --gen 32
  run "128K" 100 --lengths 131040 --policy none,tokenselect --gen 16
  run "32K round 2" 60 --lengths 32768 --policy none,tokenselect --gen 32
  run "128K hit" 100 --lengths 131040 --policy tokenselect --set tokenselect.cache_theta=-1 --gen 16
} > $O/tpot.txt 2>&1
cat $O/tpot.txt
