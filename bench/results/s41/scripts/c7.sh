# session 41, c7: two blocks a multiprocessor for full attention's split-KV decode where the memory's peak rate is
# >= 30 GB/s a multiprocessor (cuda_ctx.attn_bps; scripts/c7-attn-bps.diff). base = c3597a8 (main), new = the change.
# New's GPU tests of the decode attention (test_cuda --quick, test_attn_list --quick) and the policies' sets
# (test_cuda_policies, stories260K), then full attention beside TokenSelect at 32K (two rounds) and 128K, each build.
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
{ tst test_cuda --quick; tst test_attn_list --quick; tst test_cuda_policies; } > $O/tests.txt 2>&1
cat $O/tests.txt
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
