#!/bin/bash
# pack base/ and the variant builds ../X (XV list) into .data/s31/pk.tar.xz (one xz stream with a
# dictionary larger than a binary, so the copies of the same library in each binary are stored once)
set -e
T=$(mktemp -d)
BB=${BB:-"kvsieve bench_kernels test_cuda_prims"}
NB=${NB:-}
mkdir -p $T/base
for b in $BB; do cp ../base31/build-cuda/$b $T/base/; done
cp -r ../base31/policies $T/base/
if [ -n "$NB" ]; then mkdir -p $T/new; for b in $NB; do cp build-cuda/$b $T/new/; done; cp -r policies $T/new/; fi
for x in ${XV:-}; do mkdir -p $T/$x; for b in kvsieve bench_kernels test_cuda_prims; do [ -f ../$x/$b ] && cp ../$x/$b $T/$x/; done; cp -r policies $T/$x/; done
strip $T/*/* 2>/dev/null || true
cp build-cuda/ktrace.so $T/
tar cf - -C $T . | xz -T1 --lzma2=preset=9,dict=256MiB > .data/s31/pk.tar.xz
ls -la .data/s31/pk.tar.xz
rm -rf $T
