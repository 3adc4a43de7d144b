#!/usr/bin/env bash
# run.sh — run libFuzzer harnesses one after the other (make fuzz):
#   tests/fuzz/run.sh SECONDS NAME...
# Each build-fuzz/fuzz_NAME runs SECONDS seconds, one process on one core, from the repository
# root, on its seed corpus tests/fuzz/corpus/NAME plus its working corpus build-fuzz/corpus/NAME
# (where new units go; the committed seeds are never written). A crash, leak, timeout, OOM or
# sanitizer report leaves the reproducer in build-fuzz/artifacts/ and makes the run fail (after
# the other harnesses ran). Prints executions per harness (libFuzzer's final stats).
# Env: FUZZ_ARGS adds libFuzzer options (e.g. FUZZ_ARGS=-jobs=2).
set -uo pipefail
cd "$(dirname "$0")/../.."
secs="${1:-30}"
shift
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
mkdir -p build-fuzz/artifacts build-fuzz/logs
failed=()
summary=""
for name in "$@"; do
    bin="build-fuzz/fuzz_$name"
    [ -x "$bin" ] || { echo "fuzz: $bin is missing (make fuzz-build)" >&2; failed+=("$name(missing)"); continue; }
    mkdir -p "build-fuzz/corpus/$name"
    seeds="tests/fuzz/corpus/$name"
    [ -d "$seeds" ] || seeds=""
    log="build-fuzz/logs/$name.log"
    echo "fuzz: $name for ${secs}s" >&2
    # -timeout: one input may run at most 25 s (a hang); -rss_limit_mb: 2.5 GB (a memory bomb)
    "$bin" -max_total_time="$secs" -print_final_stats=1 -timeout=25 -rss_limit_mb=2560 \
        -artifact_prefix="build-fuzz/artifacts/$name-" ${FUZZ_ARGS:-} "build-fuzz/corpus/$name" $seeds >"$log" 2>&1
    rc=$?
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
    line=$(printf '%-16s %12s executions in %ss  exit %d' "$name" "${execs:-?}" "$secs" "$rc")
    echo "fuzz: $line" >&2
    summary+="$line"$'\n'
    if [ "$rc" != 0 ]; then
        failed+=("$name")
        echo "---- $log (last 60 lines)" >&2
        tail -60 "$log" >&2
    fi
done
echo "---- fuzz summary" >&2
printf '%s' "$summary" >&2
if [ "${#failed[@]}" != 0 ]; then
    echo "fuzz: FAILED: ${failed[*]} (reproducers in build-fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz: all ${#} harnesses clean" >&2
