# session 41, c2: where TokenSelect's selection chain spends a decode step's layer on an H200. ph = main (c3597a8) with
# %globaltimer stamps (scripts/c2-phases.diff) in the scores kernel, the top-k and the list attention of the recorded
# decode steps: thread 0 of every block prints its stamps for layers 4-7 of the step 12 after the recording (the list attention: layers 4-7 of its decode calls 8-21, matched by time). At 32K
# and 128K; bench/results/s41/scripts/ph.py reads them.
. bench/gpu_pack_env.sh
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for L in 32768 131040; do
  KVSIEVE_POLICY_PATH=$R/ph/policies timeout 120 $R/ph/kvsieve $B --lengths $L --policy tokenselect --gen 24 > $O/ph-$L.txt 2>&1
  grep -c "^PH" $O/ph-$L.txt; grep -E "^tokenselect|kvsieve:" $O/ph-$L.txt
done
