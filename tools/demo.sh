#!/usr/bin/env bash
# demo.sh — the main job on the embedded default, told plainly: a needle sentence hidden at 30%
# depth in ~2K tokens of public-domain text (../shared/corpora; the niah task of core/tasks.c),
# answered with full attention and with GemFilter (layer 2, k 256) on the CPU, with the tokens
# GemFilter kept and the needle's value marked — on two models:
#   1. models/kvsieve-tiny, the bundled default. It was fine-tuned with an objective that puts
#      layer 2's last-token attention (GemFilter's selection score) on the needle, so GemFilter
#      keeps the needle here by construction (models/kvsieve-tiny/README.md).
#   2. models/kvsieve-tiny-base, the same pre-training without that objective (git 1d70f22). Full
#      attention still answers; GemFilter's kept tokens miss the needle, because the early-layer
#      retrieval it relies on (reported for large LLMs) did not appear in this small model.
# On 11 depths 0%..100% at 2K (`kvsieve eval ... --depths 11 --cases 1`, CPU) GemFilter answers 9
# of 11 on the first and 1 of 11 (depth 100%) on the second. DEPTH=0.5 on the first shows a miss
# there too (the value is kept, the wrong number is copied). About 17 s on 2 CPU cores.
set -euo pipefail
bin=${1:-build/kvsieve}
corpora=../shared/corpora
[ -d "$corpora" ] || corpora=.data/corpora
run() {
    "$bin" eval --model "$1" --task niah --lengths 2048 --depths "${DEPTH:-0.3}" --corpora "$corpora" \
        --compare full,gemfilter --set gemfilter.layer="${GEMFILTER_LAYER:-2}" --set gemfilter.k="${GEMFILTER_K:-256}" --show --quiet
}
echo "### 1/2  models/kvsieve-tiny: fine-tuned so that layer 2's attention (GemFilter's score) points at the needle, which is why GemFilter keeps it here."
run models/kvsieve-tiny
echo
echo "### 2/2  models/kvsieve-tiny-base: the same model before that fine-tuning, same prompt. Full attention answers; GemFilter's kept tokens miss the needle."
run models/kvsieve-tiny-base
