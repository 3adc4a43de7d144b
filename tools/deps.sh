#!/usr/bin/env bash
# deps.sh — install the Debian packages kvsieve builds and tests with, when missing.
# Run as root it installs them with apt-get; otherwise it only lists what is missing.
set -eu
# the fuzz harnesses (make fuzz: clang's libFuzzer, ASan, UBSan) need clang and its runtime
# libraries; they are optional: installed when the distribution has them (Debian 12 names them
# so), else .ci/run skips the fuzz step with a message saying so
fuzz_pkgs="clang libclang-rt-14-dev"
# libevent-dev: the server's HTTP (evhttp, linked statically); python3-numpy, -cffi, -pytest, -venv, -pip,
# -setuptools, -wheel: the Python package, installed offline into a venv that sees the system numpy, and its tests
pkgs="build-essential liblua5.4-dev libpcre2-dev libutf8proc-dev libreadline-dev libncurses-dev nodejs npm python3 libevent-dev python3-numpy python3-cffi python3-pytest python3-venv python3-pip python3-setuptools python3-wheel"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# node/npm may come from elsewhere (e.g. a preinstalled node); accept them when on PATH
if command -v node >/dev/null 2>&1; then missing=$(echo "$missing" | sed 's/ nodejs//'); fi
if command -v npm >/dev/null 2>&1; then missing=$(echo "$missing" | sed 's/ npm//'); fi
# optional packages: only those the package index knows (after an update, when root)
opt_missing=""
for p in $fuzz_pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || opt_missing="$opt_missing $p"
done
if [ -n "${opt_missing# }" ] && [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2 || true
    for p in $opt_missing; do
        if apt-cache show "$p" >/dev/null 2>&1; then
            echo "tools/deps.sh: installing $p (fuzzing)" >&2
            apt-get install -y -qq "$p" >&2 || echo "tools/deps.sh: could not install $p (fuzzing will be skipped)" >&2
        else
            echo "tools/deps.sh: no package $p here (fuzzing may be skipped)" >&2
        fi
    done
elif [ -n "${opt_missing# }" ]; then
    echo "tools/deps.sh: optional (make fuzz):$opt_missing not installed" >&2
fi
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
