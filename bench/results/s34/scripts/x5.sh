# session 34: the scores kernel's phases inside TokenSelect's decode step (32K, 128K), printf stamps (sc1phases.diff)
. bench/gpu_pack_env.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
for L in 32768 131040; do
KVSIEVE_POLICY_PATH=$R/sph/policies timeout 250 $R/sph/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 --lengths $L --policy tokenselect --gen 40 > $O/sp$L.txt 2>&1
grep -c "^SP" $O/sp$L.txt; grep -E "^tokenselect" $O/sp$L.txt
xz $O/sp$L.txt
done
