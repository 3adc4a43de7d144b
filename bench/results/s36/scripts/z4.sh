# session 36, z4: g3 = a whole decode step's recording launched in three pieces (kernels/cuda_graph.cu graph_split) beside
# base36: test_cuda (all, --quick --pdl, --quick --no-graphs), timelines of full attention at 32K, TPOT of full and
# TokenSelect at 32K and 128K (two rounds each), static and rolling StreamingLLM (2K at 32K)
. bench/gpu_pack_env.sh
cp -r $R/g3 $R/new
{ tst test_cuda; tst test_cuda --quick --pdl; tst test_cuda --quick --no-graphs; } > $O/tests.txt 2>&1
cat $O/tests.txt
B="bench --random-weights bench/configs/llama-3.1-8b.json --backend cuda --repeat 1"
for v in base36 g3 base36 g3; do
  echo "== $v full32 timeline"
  KVSIEVE_POLICY_PATH=$R/$v/policies CUDA_INJECTION64_PATH=$R/ktrace.so KTRACE_OUT=$R/t.csv timeout 200 $R/$v/kvsieve $B --lengths 32768 --policy none --gen 12 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
  python3 bench/ktrace.py $R/t.csv --steps 8 --skip 2 2>&1 | head -12; rm -f $R/t.csv
done > $O/trace.txt 2>&1
cat $O/trace.txt
for r in 1 2; do for v in base36 g3; do echo "== $v 32K round $r"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 32768 --policy none,tokenselect --gen 32 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/r32.txt 2>&1
cat $O/r32.txt
for r in 1 2; do for v in base36 g3; do echo "== $v 128K round $r"
  KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 131040 --policy none,tokenselect --gen 16 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'
done; done > $O/r128.txt 2>&1
cat $O/r128.txt
for v in base36 g3; do echo "== $v streamingllm 2K at 32K, static then rolling"
  for x in "" "--set rolling=true"; do KVSIEVE_POLICY_PATH=$R/$v/policies timeout 150 $R/$v/kvsieve $B --lengths 32768 --gen 32 --policy streamingllm --set budget=2048 $x 2>&1 | grep -E '^[a-z]+ +[0-9]+ |kvsieve:'; done
done > $O/sllm.txt 2>&1
cat $O/sllm.txt
