#!/usr/bin/env bash
# base_model.sh — writes models/kvsieve-tiny-base/model.safetensors, the natural pre-trained
# weights of the bundled model, from this repository's own history (commit 1d70f22, where they
# were models/kvsieve-tiny/model.safetensors). The file is not tracked a second time: two 40 MB
# checkpoints in the working tree would exceed what a GPU-machine call of this workplace carries
# (64 MiB), while the history already holds this one byte for byte. `make test` and `make demo`
# run this first; it checks the git blob id of what it wrote.
set -euo pipefail
cd "$(dirname "$0")/.."
blob=7b95756c63ee275dff66affbba8cf24cc8f7a2c5   # git hash-object of the 1d70f22 weights
out=models/kvsieve-tiny-base/model.safetensors
if [ -f "$out" ] && [ "$(git hash-object "$out" 2>/dev/null)" = "$blob" ]; then exit 0; fi
if ! git cat-file -e "$blob" 2>/dev/null; then
    echo "tools/base_model.sh: the base weights (git blob $blob, commit 1d70f22) are not in this checkout's history; a shallow clone lacks them: git fetch --unshallow" >&2
    exit 1
fi
git cat-file blob "$blob" > "$out.tmp"
[ "$(git hash-object "$out.tmp")" = "$blob" ] || { rm -f "$out.tmp"; echo "tools/base_model.sh: $out: wrong bytes from git" >&2; exit 1; }
mv "$out.tmp" "$out"
echo "tools/base_model.sh: wrote $out from git history (1d70f22)" >&2
