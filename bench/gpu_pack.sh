#!/bin/bash
# Packs variant builds for a device call: VD is a folder outside the repository holding one folder per build named in
# XV (each with its kvsieve and any test programs), PK the xz'd tar to write (default .data/pk.tar.xz). Each build's
# folder gets a copy of policies/, and the tar bench/ktrace.so's build (build-cuda/ktrace.so, from
# `cc -O2 -shared -fPIC -I/usr/local/cuda/include bench/ktrace.c -o build-cuda/ktrace.so -L/usr/local/cuda/lib64 -lcupti`).
# bench/gpu_pack_env.sh unpacks it on the device. Run from the repository root.
set -e
VD=${VD:?the folder of the variant builds}
PK=${PK:-.data/pk.tar.xz}
T=$(mktemp -d)
for x in ${XV:-}; do mkdir -p $T/$x; for b in kvsieve bench_kernels test_cuda_prims test_cuda_policies test_attn_list test_cuda test_attn_decode_batch test_gemm_rows test_tp_cuda test_wgmma; do [ -f $VD/$x/$b ] && cp $VD/$x/$b $T/$x/; done; cp -r policies $T/$x/; done
strip $T/*/* 2>/dev/null || true
cp build-cuda/ktrace.so $T/
mkdir -p "$(dirname "$PK")"
tar cf - -C $T . | xz -T2 --lzma2=preset=9,dict=256MiB > "$PK"
ls -la "$PK"
rm -rf $T
