# session 39, c5: base beside new (the scores kernel's first tile loads issued once the thread's query came back, after
# its rotation; scripts/c5-qA.diff) and nB (issued once the block's query fragments are cut; scripts/c5-qB.diff). GPU tests
# of new (test_cuda_prims --only scores, --only grow), timelines of TokenSelect at 32K and 128K, TPOT rounds beside full
# attention: two at 32K, one at 128K.
# The steps are c4.sh's (the same script ran, under this name).
. bench/results/s39/scripts/c4.sh
