#!/bin/bash
# m4: issue 14's table again (a second run of m3's rows on the same binaries: 51a8dc5 as new beside 839b1b1 as base).
TAG=$TAG PK=$PK V="base new" bash bench/gpu_s20.sh final32 final128
cat $OUT/$TAG/final.txt
