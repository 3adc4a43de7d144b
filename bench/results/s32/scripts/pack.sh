#!/bin/bash
# pack the variant builds ../X (XV list: each folder holds a kvsieve built from main plus that variant's
# diff), the policies and build-cuda/ktrace.so into .data/s32/pk.tar.xz; run from the repository root
set -e
T=$(mktemp -d)
for x in ${XV:-}; do mkdir -p $T/$x; cp ../$x/kvsieve $T/$x/; cp -r policies $T/$x/; done
strip $T/*/* 2>/dev/null || true
cp build-cuda/ktrace.so $T/
tar cf - -C $T . | xz -T2 --lzma2=preset=9,dict=256MiB > .data/s32/pk.tar.xz
ls -la .data/s32/pk.tar.xz
rm -rf $T
