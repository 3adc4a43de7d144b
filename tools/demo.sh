#!/usr/bin/env bash
# demo.sh — the main job on the embedded default: the project's own long-context model
# (models/kvsieve-tiny) on the CPU, a passkey hidden in ~2K tokens of filler (the task format of
# tools/train/tasks.py), answered with full attention and with GemFilter, with both timings.
set -euo pipefail
bin=${1:-build/kvsieve}
filler="The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
half=""
for i in $(seq 40); do half="$half $filler"; done
prompt="There is a pass key hidden in the following text. Find it and remember it; you will be asked for it at the end.
${half# } The pass key is 68219. Remember it. 68219 is the pass key.$half
What is the pass key? The pass key is"
echo "== full attention"
"$bin" generate -m models/kvsieve-tiny -p "$prompt" -n 6 | tail -c 60
echo "== gemfilter (filter layer 3, k 128)"
"$bin" generate -m models/kvsieve-tiny -p "$prompt" -n 6 --policy gemfilter --set layer=3 --set k=128 | tail -c 60
