# Sourced by the per-session device scripts (bench/gpu_s17.sh, bench/gpu_s18.sh): unpacks the binaries
# (PK, an xz'd tar) into a temporary folder R, makes the output folder O ($OUT/TAG), sets the GPU
# environment (GPU 0, no NVLink multicast, CUDA's libraries, the stories260K model for the policy
# tests), writes the card's name to O/card.txt and defines tst BINARY ARGS... (runs R/new/BINARY,
# prints its failures and summary). Before sourcing: TAG and PK.
R=$(mktemp -d); O="$OUT/$TAG"; mkdir -p $O
xz -dc $PK | tar xf - -C $R
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} KS_STORIES=.data/stories260K
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/card.txt
tst() { # tst BINARY ARGS...: its failures and summary
    [ -x $R/new/$1 ] || return 0
    echo "== $*"; local b=$1; shift
    timeout 250 $R/new/$b "$@" 2>&1 | grep -v "^  ok" | grep -v "^  time" | tail -12
}
