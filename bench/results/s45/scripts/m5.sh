#!/bin/bash
# m5: device timelines of 51a8dc5 (new) under bench/ktrace.c: TokenSelect at 32K, the hit path, Quest and full at
# 128K (bench/gpu_s20.sh trace), then TokenSelect at 128K (ts128t); us a decode step over steps 3-10 of --gen 12.
TAG=$TAG PK=$PK V=new bash bench/gpu_s20.sh trace ts128t
cat $OUT/$TAG/trace.txt | grep -v '^[a-z_0-9]* *dur'
