# session 41, c6: c5 again with more rounds: full attention's decode with the automatic split (0: one block a
# multiprocessor, 16 a KV head) against 33 and 49 split-KV blocks a KV head (KS_CUDA_TC_SPLITS), three rounds at
# 128K and at 32K, the three counts interleaved in each round. base = c3597a8 (main, pk1).
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 --policy none"
{ for r in 1 2 3; do for sp in 0 33 49; do echo "== splits $sp 128K round $r"
    KS_CUDA_TC_SPLITS=$sp KVSIEVE_POLICY_PATH=$R/base/policies timeout 60 $R/base/kvsieve $B --lengths 131040 --gen 16 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  done; done
  for r in 1 2 3; do for sp in 0 33 49; do echo "== splits $sp 32K round $r"
    KS_CUDA_TC_SPLITS=$sp KVSIEVE_POLICY_PATH=$R/base/policies timeout 60 $R/base/kvsieve $B --lengths 32768 --gen 32 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  done; done
} > $O/tpot.txt 2>&1
cat $O/tpot.txt
