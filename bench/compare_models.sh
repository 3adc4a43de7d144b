#!/usr/bin/env bash
# compare_models.sh — the same `kvsieve eval` grid, every policy at one KV budget, on the bundled
# model (models/kvsieve-tiny, fine-tuned so that layer 2's GemFilter score points at the needle)
# and on its natural base (models/kvsieve-tiny-base, the same pre-training without that
# objective). Issue 18: which policies work on a model that was not built for them.
#
#   bash bench/compare_models.sh RESULTS_DIR                  # the grid, on the GPU (CUDA backend)
#   BACKEND=cpu LENGTHS=512 DEPTHS=0,1 CASES=1 bash bench/compare_models.sh cmp-smoke  # CPU smoke
#
# Default grid: niah at 2K and 4K, 11 depths (0%..100%), 4 cases per cell = 88 cases per policy
# and model, cases from the held-out seed base (repl/cmd_eval.c). Budget B = 512 (BUDGET=...):
# at decode every policy holds or attends at most B prompt rows per layer and KV head:
#   full          no pruning (the reference)
#   snapkv        budget=B (window 32 included)
#   fastkv        mode=absolute, tsp_layer=2, tsp_len=B, capacity=B (propagates B rows after
#                 layer 2, keeps B KV rows per KV head at every layer; bench/gpu_eval.sh used the
#                 proportional mode, 20% / 10% of the prompt, instead)
#   asl           L_min=3, L_obs=3, k=B, kv_budget=B (one pass; the KV budget at every layer)
#   gemfilter     layer=2, k=B (a fresh prefill of the B kept tokens)
#   tokenselect   n_init=16 + k=B-64 + n_local=48 (attends B rows per step; the KV stays resident)
#   streamingllm  budget=B (4 sinks + the most recent rows)
# Extra --set options: SETS_EXTRA="--set asl.kv_budget=0 ...", applied after these.
#
# Environment: KVSIEVE (the binary; for BACKEND=cuda build-cuda/kvsieve, or when that is absent
# .data/kvs.xz unpacked to .data/run/kvsieve as bench/gpu_eval.sh does; for BACKEND=cpu
# build/kvsieve), BACKEND (cuda), CORPORA (../shared/corpora, else .data/corpora), TASK (niah),
# LENGTHS (2K,4K), DEPTHS (11: a count, or a list such as 0,0.5,1), CASES (4), BUDGET (512; with
# tokenselect at least 512, its prefill chunk), MODELS (models/kvsieve-tiny
# models/kvsieve-tiny-base), POLICIES (all seven, comma-separated).
#
# Writes under RESULTS_DIR, per model NAME (the folder's basename): NAME.json (every case and
# cell), NAME.png (heatmaps, one panel per policy), NAME.txt (the terminal tables), and
# summary.md (exact match and needle value kept per policy, both models side by side), and
# command.txt (the eval command lines, binary, backend and source revision).
set -euo pipefail

out=${1:?usage: bash bench/compare_models.sh RESULTS_DIR (env: BACKEND KVSIEVE CORPORA TASK LENGTHS DEPTHS CASES BUDGET MODELS POLICIES)}
backend=${BACKEND:-cuda}
if [ "$backend" = cuda ]; then bin=${KVSIEVE:-build-cuda/kvsieve}; else bin=${KVSIEVE:-build/kvsieve}; fi
# on the GPU machine without a build: the carried binary .data/kvs.xz (as bench/gpu_eval.sh)
if [ -z "${KVSIEVE:-}" ] && [ "$backend" = cuda ] && [ ! -x "$bin" ] && [ -f .data/kvs.xz ]; then
    mkdir -p .data/run && xz -dc .data/kvs.xz > .data/run/kvsieve && chmod +x .data/run/kvsieve
    bin=.data/run/kvsieve
fi
corpora=${CORPORA:-../shared/corpora}
[ -d "$corpora" ] || corpora=.data/corpora
task=${TASK:-niah}
lengths=${LENGTHS:-2K,4K}
depths=${DEPTHS:-11}
cases=${CASES:-4}
B=${BUDGET:-512}
models=${MODELS:-models/kvsieve-tiny models/kvsieve-tiny-base}
policies=${POLICIES:-full,snapkv,fastkv,asl,gemfilter,tokenselect,streamingllm}

[ -x "$bin" ] || { echo "compare_models.sh: no kvsieve binary at $bin (set KVSIEVE=...)" >&2; exit 2; }
[ -d "$corpora" ] || { echo "compare_models.sh: no corpora folder (../shared/corpora or .data/corpora; CORPORA=...)" >&2; exit 2; }
[ "$B" -gt 64 ] || { echo "compare_models.sh: BUDGET must exceed 64 (tokenselect's n_init + n_local)" >&2; exit 2; }
case ",$policies," in *,tokenselect,*)
    [ "$B" -ge 512 ] || { echo "compare_models.sh: tokenselect needs BUDGET >= 512 (its prefill chunk is 512 rows; leave it out of POLICIES for a smaller budget)" >&2; exit 2; } ;;
esac

sets=(--set snapkv.budget=$B
      --set fastkv.mode=absolute --set fastkv.tsp_layer=2 --set fastkv.tsp_len=$B --set fastkv.capacity=$B
      --set asl.L_min=3 --set asl.L_obs=3 --set asl.k=$B --set asl.kv_budget=$B
      --set gemfilter.layer=2 --set gemfilter.k=$B
      --set tokenselect.n_init=16 --set tokenselect.n_local=48 --set tokenselect.k=$((B - 64))
      --set streamingllm.budget=$B)
# shellcheck disable=SC2206
extra=(${SETS_EXTRA:-})

mkdir -p "$out"
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
{
    echo "# bench/compare_models.sh $out  (source revision $rev, $(date -u +%Y-%m-%dT%H:%M:%SZ))"
    echo "# binary $bin, backend $backend, corpora $corpora"
} > "$out/command.txt"

names=()
for m in $models; do
    name=$(basename "$m")
    names+=("$name")
    cmd=("$bin" eval --model "$m" --task "$task" --lengths "$lengths" --depths "$depths" --cases "$cases"
         --compare "$policies" "${sets[@]}" "${extra[@]}" --corpora "$corpora" --backend "$backend" --quiet
         --out "$out/$name.json" --png "$out/$name.png")
    echo "${cmd[*]}" >> "$out/command.txt"
    echo "== $name: $task, lengths $lengths, depths $depths, $cases case(s) per cell, budget $B, backend $backend" >&2
    t0=$(date +%s)
    "${cmd[@]}" > "$out/$name.txt"
    echo "   $(( $(date +%s) - t0 )) s; $out/$name.txt, $out/$name.json, $out/$name.png" >&2
done

# summary.md: one row per policy, both models side by side, from each run's per-policy line
# ("NAME exact match C/N = X | needle value tokens kept Y | mean prefill Z s").
{
    echo "$task, lengths $lengths, depths $depths, $cases case(s) per cell, budget $B, backend $backend (bench/compare_models.sh; command.txt)"
    echo
    printf '| policy |'; for n in "${names[@]}"; do printf ' %s: exact match | %s: value kept |' "$n" "$n"; done; echo
    printf '|---|'; for _ in "${names[@]}"; do printf -- '---|---|'; done; echo
    IFS=, read -ra plist <<< "$policies"
    for p in "${plist[@]}"; do
        printf '| %s |' "$p"
        for n in "${names[@]}"; do
            awk -v p="$p" -F'|' '
                { split($1, a, " ") }
                a[1] == p && a[2] == "exact" && a[3] == "match" {
                    split($2, b, " ")
                    printf " %s (%s) | %s |", a[6], a[4], b[5]; found = 1; exit
                }
                END { if (!found) printf " - | - |" }' "$out/$n.txt"
        done
        echo
    done
} > "$out/summary.md"
cat "$out/summary.md"
