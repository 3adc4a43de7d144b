# GPU evaluation grids on models/kvsieve-tiny (CUDA backend): full-attention accuracy to and past the
# training length (110 cases per cell), and every policy side by side on the same cases.
set -x
mkdir -p .data/run && xz -dc .data/kvs.xz > .data/run/kvsieve && chmod +x .data/run/kvsieve
K=.data/run/kvsieve
M=models/kvsieve-tiny
C="--corpora .data/corpora --backend cuda --quiet"
P="--set snapkv.budget=512 --set streamingllm.budget=512 --set gemfilter.layer=2 --set gemfilter.k=512 --set fastkv.tsp_layer=2 --set asl.L_min=3 --set asl.L_obs=3 --set asl.k=512 --set tokenselect.n_init=16 --set tokenselect.n_local=48 --set tokenselect.k=448"
for t in ${FULL_TASKS-passkey niah multikey kv}; do
  $K eval --model $M --task $t --lengths 1K,2K,4K,8K,16320 --depths 11 --cases 10 --policy full $C --out $OUT/full_$t.json --png $OUT/full_$t.png > $OUT/full_$t.txt 2>&1 &
done
for t in niah passkey; do
  $K eval --model $M --task $t --lengths 2K,4K,8K,16320 --depths 11 --cases 2 --compare full,streamingllm,snapkv,gemfilter,fastkv,asl,tokenselect $P $C --out $OUT/cmp_$t.json --png $OUT/cmp_$t.png > $OUT/cmp_$t.txt 2>&1 &
done
wait
for f in $OUT/*.txt; do echo "== $f"; grep -v "^\[eval\]" $f | head -80; done
