# session 40, c8: bench's warm-up with three decode steps (pk5: base = 06668d1, new = its warm-up decoding three untimed
# steps after the short prefill, so the first row's timed steps no longer load the process's kernels). Full attention
# beside TokenSelect at 32K (two rounds) and 128K (one), TPOT and step_ms, each build.
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
run() { # run LABEL SECONDS ARGS...: each build
  local l=$1 s=$2; shift 2
  for v in base new; do echo "== $v $l"
    KVSIEVE_POLICY_PATH=$R/$v/policies timeout $s $R/$v/kvsieve $B "$@" 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  done
}
{ for r in 1 2; do run "32K round $r" 80 --lengths 32768 --policy none,tokenselect --gen 32; done
  run "128K" 100 --lengths 131040 --policy none,tokenselect --gen 16
} > $O/tpot.txt 2>&1
cat $O/tpot.txt
