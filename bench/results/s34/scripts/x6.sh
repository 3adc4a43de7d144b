# session 34: q1 = the scores kernel's query loads before its first tile's (q1.diff): its GPU tests, its phases (q1ph =
# q1 + sc1phases.diff) at 32K and 128K, timelines beside base34
. bench/gpu_pack_env.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib:$LD_LIBRARY_PATH
cp -r $R/q1 $R/new
{ tst test_cuda_prims --only scores; tst test_cuda_prims --only grow; } > $O/tests.txt 2>&1
for c in "32768:40" "131040:32"; do L=${c%%:*}; g=${c#*:}
KVSIEVE_POLICY_PATH=$R/q1ph/policies timeout 250 $R/q1ph/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 --lengths $L --policy tokenselect --gen $g > $O/sp$L.txt 2>&1
grep -c "^SP" $O/sp$L.txt; xz $O/sp$L.txt
done
for c in "ts32:--lengths 32768 --policy tokenselect" "ts128:--lengths 131040 --policy tokenselect"; do for v in base34 q1 base34 q1; do
  n=${c%%:*}; a=${c#*:}
  echo "== $v $n"
  KVSIEVE_POLICY_PATH=$R/$v/policies CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $R/$v/kvsieve bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1 $a --gen 12 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -9; rm -f $R/t.csv
done; done > $O/trace.txt 2>&1
cat $O/tests.txt; grep -E "==|wall|sc1_logits|tokenselect" $O/trace.txt
