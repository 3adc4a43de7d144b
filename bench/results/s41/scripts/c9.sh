# session 41, c9: Quest (budget 4096) alone at 128K, base then new of c7's pack (pk7), after c8's Quest row read 6.13 ms
# a step against session 40's 5.84-5.89: does the change to full attention's split touch Quest? (Its list attention
# takes its own split count.) Run as one command line on the device:
export TAG=s41/c9 PK=.data/s41/pk7.tar.xz; . bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for v in base new; do echo "== $v"; KVSIEVE_POLICY_PATH=$R/$v/policies timeout 70 $R/$v/kvsieve $B --lengths 131040 --gen 16 --policy quest --set quest.budget=4096 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'; done 2>&1 | tee $O/quest.txt
