#!/usr/bin/env python3
"""Side-by-side table of `kvsieve bench` (its text output) and tools/hf_bench.py (its --json),
measured in the same device call on the same config. Standard library only.

    python3 tools/bench_compare.py OURS.txt HF.json [HF_CUDNN.json ...]

Rows are matched by context length: an HF row is paired with our row of the nearest length
within 1% (our bench leaves room for the generated tokens: 131056 next to HF's 131072)."""
import json
import sys


def ours_rows(path):
    rows = []
    with open(path) as f:
        for line in f:
            p = line.split()
            # policy tokens TTFT_s prefill_t/s linear_GF/s sgemm_GF/s linear% TPOT_ms KV_rows [peak_GiB]
            if len(p) >= 9 and p[1].isdigit() and not line.startswith(" "):
                try:
                    r = {"policy": p[0], "tokens": int(p[1]), "ttft_s": float(p[2]), "tpot_ms": float(p[7]),
                         "kv_rows": int(p[8])}
                except ValueError:
                    continue
                if len(p) >= 10:
                    try:
                        r["peak_gib"] = float(p[9])
                    except ValueError:
                        pass
                rows.append(r)
    return rows


def hf_rows(path):
    with open(path) as f:
        d = json.load(f)
    tag = "HF %s" % d.get("sdpa_backend", "?")
    return tag, d.get("device", "?"), [r for r in d["rows"] if "error" not in r]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    ours = ours_rows(sys.argv[1])
    if not ours:
        sys.exit("bench_compare: no bench rows in %s" % sys.argv[1])
    hfs = [hf_rows(p) for p in sys.argv[2:]]
    print("device: %s" % ", ".join(sorted({d for _, d, _ in hfs})))
    head = "%-12s %8s %9s %9s %9s" % ("policy", "tokens", "TTFT_s", "TPOT_ms", "peak_GiB")
    for tag, _, _ in hfs:
        head += " | %-10s %9s %9s %9s %8s" % (tag, "TTFT_s", "TPOT_ms", "peak_GiB", "TTFT x")
    print(head)
    for r in ours:
        line = "%-12s %8d %9.3f %9.2f %9s" % (r["policy"], r["tokens"], r["ttft_s"], r["tpot_ms"],
                                              "%.2f" % r["peak_gib"] if "peak_gib" in r else "-")
        for tag, _, rows in hfs:
            m = [h for h in rows if abs(h["tokens"] - r["tokens"]) <= 0.01 * h["tokens"]]
            if m:
                h = m[0]
                line += " | %-10s %9.3f %9.2f %9.2f %7.2fx" % ("", h["ttft_s"], h["tpot_ms"], h["peak_gib"],
                                                            h["ttft_s"] / r["ttft_s"] if r["ttft_s"] > 0 else 0)
            else:
                line += " | %-10s %9s %9s %9s %8s" % ("", "-", "-", "-", "-")
        print(line)
    print("TTFT x = HF TTFT / ours (above 1: we are faster); HF runs full attention only")


if __name__ == "__main__":
    main()
