#!/usr/bin/env bash
# deps.sh — install the Debian packages kvsieve builds and tests with, when missing.
# Run as root it installs them with apt-get; otherwise it only lists what is missing.
set -eu
pkgs="build-essential libopenblas-dev libopenblas-openmp-dev liblua5.4-dev libpcre2-dev libutf8proc-dev libreadline-dev libncurses-dev nodejs npm python3"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# node/npm may come from elsewhere (e.g. a preinstalled node); accept them when on PATH
if command -v node >/dev/null 2>&1; then missing=$(echo "$missing" | sed 's/ nodejs//'); fi
if command -v npm >/dev/null 2>&1; then missing=$(echo "$missing" | sed 's/ npm//'); fi
[ -z "${missing# }" ] && exit 0
if [ "$(id -u)" = 0 ]; then
    echo "tools/deps.sh: installing:$missing" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq $missing >&2
else
    echo "tools/deps.sh: missing Debian packages:$missing (run as root, or: sudo apt-get install$missing)" >&2
    exit 1
fi
