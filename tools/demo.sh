#!/usr/bin/env bash
# demo.sh — the main job on the embedded default: the project's own long-context model
# (models/kvsieve-tiny) on the CPU, a needle sentence hidden at 30% depth in ~2K tokens of
# public-domain text (../shared/corpora; the niah task of core/tasks.c), answered with full
# attention and with GemFilter; both answers, both timings, and the tokens GemFilter kept with
# the needle's value marked (the GemFilter paper's Figure 1, live). On this model GemFilter
# (layer 2, k 256) answers 9 of the 11 depths 0%..100% at 2K (`kvsieve eval ... --depths 11`); the
# demo shows depth 0.3 (DEPTH=0.5 shows a miss: the value is kept, the wrong number is copied).
set -euo pipefail
bin=${1:-build/kvsieve}
corpora=../shared/corpora
[ -d "$corpora" ] || corpora=.data/corpora
"$bin" eval --model models/kvsieve-tiny --task niah --lengths 2048 --depths ${DEPTH:-0.3} --corpora "$corpora" \
    --compare full,gemfilter --set gemfilter.layer=${GEMFILTER_LAYER:-2} --set gemfilter.k=${GEMFILTER_K:-256} --show --quiet
