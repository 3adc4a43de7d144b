# Issue 14, the per-layer host cost of decode-time Lua policies (helper "hostpath"): on the GPU
# machine in one call, `kvsieve bench` of the build before (.data/hostpath/base: the tree at
# commit 57c5b9d) and after (.data/hostpath/new: a young collection at the end of each event
# instead of a full one), full and TokenSelect at 32K, alternating; then, while time is left,
# TokenSelect with --profile for each (the policy phase). Carry .data/hostpath (stripped, xz'd:
# base/kvsieve.xz, new/kvsieve.xz, inst/kvsieve.xz: new plus a temporary clock in lua/events.c
# printing the host time of a decode event: trampoline, handler call, settle). Usage: bash bench/gpu_hostpath.sh
S=.data/hostpath; R=$(mktemp -d); mkdir -p $R/base $R/new $R/inst
for v in base new inst; do xz -dc $S/$v/kvsieve.xz > $R/$v/kvsieve; chmod +x $R/$v/kvsieve; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/card.txt
C="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --lengths 32768 --gen 32 --repeat 1"
echo "== inst $(date +%T)" > $OUT/inst.txt; timeout 40 $R/inst/kvsieve $C --policy tokenselect >> $OUT/inst.txt 2>&1
for v in base new base new; do echo "== $v $(date +%T)"; timeout 60 $R/$v/kvsieve $C --policy none,tokenselect 2>&1; done > $OUT/bench.txt
for v in base new; do echo "== $v profile $(date +%T)"; timeout 40 $R/$v/kvsieve $C --policy tokenselect --profile 2>&1; done > $OUT/profile.txt
rm -rf $R
grep -E "^==|^none|^tokenselect|^  policy|^  attention|^  wall" $OUT/bench.txt $OUT/profile.txt; grep -E "TRC|^tokenselect" $OUT/inst.txt
