#!/usr/bin/env bash
# setup.sh — installs the official `openai` npm client that tests/serve/client.mjs drives against
# `kvsieve serve` (tests/test_serve.c), at a pinned version, into tests/serve/node_modules_dir/
# (ignored by git). Idempotent: nothing is fetched when that version is already there. Needs node
# >= 18 and npm, and the npm registry the first time; on failure it says why and exits non-zero
# (the test then counts a skip).
set -euo pipefail
OPENAI_VERSION=5.23.2
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="$here/node_modules_dir"
die() { echo "tests/serve/setup.sh: $*" >&2; exit 1; }
command -v node >/dev/null 2>&1 || die "node is not installed (need node >= 18 and npm)"
command -v npm >/dev/null 2>&1 || die "npm is not installed"
[ "$(node -p 'process.versions.node.split(".")[0]')" -ge 18 ] 2>/dev/null || die "node $(node --version) is too old (need >= 18)"
have="$(node -p "require('$dir/node_modules/openai/package.json').version" 2>/dev/null || true)"
[ "$have" = "$OPENAI_VERSION" ] && exit 0
mkdir -p "$dir"
echo "tests/serve/setup.sh: npm install openai@$OPENAI_VERSION" >&2
npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "openai@$OPENAI_VERSION" >&2 ||
    die "npm install openai@$OPENAI_VERSION failed (is the npm registry reachable?)"
