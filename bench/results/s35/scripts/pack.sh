#!/bin/bash
# pack the variant builds $VD/X (XV list; VD a folder outside the repository) into .data/s35/pk.tar.xz
# (run from the repository root; build-cuda/ktrace.so from `make CUDA=1 build-cuda/ktrace.so`)
set -e
VD=${VD:?the folder of the variant builds}
T=$(mktemp -d)
for x in ${XV:-}; do mkdir -p $T/$x; for b in kvsieve bench_kernels test_cuda_prims test_cuda_policies test_attn_list test_cuda test_attn_decode_batch test_gemm_rows test_tp_cuda test_wgmma; do [ -f $VD/$x/$b ] && cp $VD/$x/$b $T/$x/; done; cp -r policies $T/$x/; done
strip $T/*/* 2>/dev/null || true
cp build-cuda/ktrace.so $T/
tar cf - -C $T . | xz -T2 --lzma2=preset=9,dict=256MiB > .data/s35/pk.tar.xz
ls -la .data/s35/pk.tar.xz
rm -rf $T
