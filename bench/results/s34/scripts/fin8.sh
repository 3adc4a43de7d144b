# session 34: full attention's 8K row four times a build, base34 and q1f alternating (the command of the call fin8)
export TAG=s34/fin8 PK=.data/s34/pk.tar.xz; . bench/gpu_pack_env.sh; export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
for r in 1 2; do for v in base34 q1f q1f base34; do echo -n "8K $v: "; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 100 $R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 --lengths 8192 --gen 8 --policy none 2>&1 | grep -E "^none"; done; done | tee $O/final.txt
