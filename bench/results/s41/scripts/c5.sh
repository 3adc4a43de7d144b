# session 41, c5: full attention's decode on an H200 with more split-KV blocks than one a multiprocessor (KS_CUDA_TC_SPLITS,
# the repl's tuning of ks_tuning.decode_splits; 0 = automatic: 16 a KV head, 128 blocks). base = c3597a8 (main, pk1).
# TPOT and step_ms at 32K and 128K for each split count; two rounds at 32K.
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 --policy none"
{ for r in 1 2; do for sp in 0 24 33 49 66; do echo "== splits $sp 32K round $r"
    KS_CUDA_TC_SPLITS=$sp KVSIEVE_POLICY_PATH=$R/base/policies timeout 60 $R/base/kvsieve $B --lengths 32768 --gen 32 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  done; done
  for sp in 0 24 33 49 66; do echo "== splits $sp 128K"
    KS_CUDA_TC_SPLITS=$sp KVSIEVE_POLICY_PATH=$R/base/policies timeout 60 $R/base/kvsieve $B --lengths 131040 --gen 16 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  done
} > $O/tpot.txt 2>&1
cat $O/tpot.txt
