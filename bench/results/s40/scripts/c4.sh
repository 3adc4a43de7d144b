# session 40, c4: TPOT over 32 and over 96 generated tokens (the decode time's warm-up: the first plain step, the
# recordings and joins), full attention, the no-op handler and TokenSelect at 32K, main's build (pk1 base = db279da),
# two rounds; then the same at 128K over 16 and 48 tokens, one round. The marginal time a token is
# (96 TPOT96 - 32 TPOT32) / 64.
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
{ for r in 1 2; do for g in 32 96; do echo "== base 32K gen $g round $r"
  KVSIEVE_POLICY_PATH=$R/base/policies timeout 90 $R/base/kvsieve $B --lengths 32768 --policy none,noop,tokenselect --gen $g 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  done; done
  for g in 16 48; do echo "== base 128K gen $g"
  KVSIEVE_POLICY_PATH=$R/base/policies timeout 120 $R/base/kvsieve $B --lengths 131040 --policy none,tokenselect --gen $g 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  done
} > $O/tpot.txt 2>&1
cat $O/tpot.txt
