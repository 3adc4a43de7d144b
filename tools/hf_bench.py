#!/usr/bin/env python3
"""HF transformers baseline for `kvsieve bench`: the same model config with random bf16
weights, SDPA attention, batch 1, on one GPU. Prints TTFT (one prefill, timed with CUDA
events after a warm-up), TPOT (median single-token decode step with the KV cache) and the
peak device memory, per context length, as a table and as JSON (--json FILE).

    python3 tools/hf_bench.py --config bench/configs/llama-3.1-8b.json --lengths 8192,32768,131072

Run it in the same device call as `kvsieve bench --random-weights ...` so the two sides are
measured on the same machine; tools/bench_compare.py prints them side by side.
"""
import argparse
import json
import statistics
import sys

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--lengths", default="8192,32768,131072")
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--sdpa-backend", default="default", choices=["default", "flash", "cudnn", "efficient"])
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(a.config)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    dev = torch.device("cuda")
    with dev:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    # random, never zero: default init is N(0, 0.02); norms are ones
    backend_ctx = None
    if a.sdpa_backend != "default":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend_ctx = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                       "efficient": SDPBackend.EFFICIENT_ATTENTION}[a.sdpa_backend]
    rows = []

    def timed(fn):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        out = fn()
        e.record()
        torch.cuda.synchronize()
        return out, s.elapsed_time(e) / 1000.0

    def run(L):
        ids = torch.randint(0, cfg.vocab_size, (1, L), device=dev, generator=torch.Generator(device=dev).manual_seed(L))
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        with torch.inference_mode():
            out, ttft = timed(lambda: model(input_ids=ids, use_cache=True, logits_to_keep=1))
            past = out.past_key_values
            tok = out.logits[:, -1:].argmax(-1)
            steps = []
            for i in range(a.decode_steps):
                out, t = timed(lambda: model(input_ids=tok, past_key_values=past, use_cache=True, logits_to_keep=1))
                past = out.past_key_values
                tok = out.logits[:, -1:].argmax(-1)
                steps.append(t)
        peak = torch.cuda.max_memory_allocated() / 2**30
        del past, out
        return ttft, statistics.median(steps), peak

    def go():
        run(1024)  # warm-up: kernels, cuBLAS handles, allocator
        for L in [int(x) for x in a.lengths.split(",")]:
            try:
                ttft, tpot, peak = run(L)
                rows.append({"tokens": L, "ttft_s": ttft, "tpot_ms": tpot * 1e3, "peak_gib": peak})
            except torch.OutOfMemoryError:
                rows.append({"tokens": L, "error": "out of memory"})
                torch.cuda.empty_cache()
            print("hf", json.dumps(rows[-1]), flush=True)

    if backend_ctx is not None:
        with sdpa_kernel(backend_ctx):
            go()
    else:
        go()
    res = {"side": "hf-transformers", "transformers": transformers.__version__, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(), "sdpa_backend": a.sdpa_backend, "config": a.config, "rows": rows}
    print("%-10s %10s %10s %10s" % ("tokens", "TTFT_s", "TPOT_ms", "peak_GiB"))
    for r in rows:
        if "error" in r:
            print("%-10d %s" % (r["tokens"], r["error"]))
        else:
            print("%-10d %10.3f %10.2f %10.1f" % (r["tokens"], r["ttft_s"], r["tpot_ms"], r["peak_gib"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
