# Session 19's device calls (GPU 0): the same steps as bench/gpu_s20.sh (which grew from this
# script and keeps every step it had), with TAG=s19: binaries from .data/s19/pk.tar.xz (PK=FILE to
# override; base/ = main before session 19, 8176741, and new/), outputs under $OUT/s19/. One
# difference from the script session 19 ran: ncub profiles the new build only.
# Usage: bash bench/gpu_s19.sh STEP...   (the steps: bench/gpu_s20.sh's header)
TAG=s19 exec bash "$(dirname "$0")/gpu_s20.sh" "$@"
