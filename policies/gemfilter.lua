-- gemfilter.lua — use an early layer as a filter, then prefill again on the selected tokens.
--
-- Paper: Z. Shi, Y. Ming, X.-P. Nguyen, Y. Liang, S. Joty, "Discovering the Gems in Early
-- Layers: Accelerating Long-Context LLMs with 1000x Input Token Reduction" (2024,
-- arXiv:2409.17422; shared/papers/gemfilter.txt). Semantics as the authors' code runs it:
-- shared/POLICIES.md "gemfilter" (SalesforceAIResearch/GemFilter).
--
-- What it does (two passes):
--   pass 1  layers 0..layer run on all n prompt tokens (their KV is dropped). At the filter
--           layer, after RoPE: score[j] = sum over all H query heads of q_last[h] . k[j]
--           (the last prompt token's query, each query head against its own KV head, raw
--           logits: no 1/sqrt(d), no softmax) -> one vector of n; 1-D average pooling,
--           kernel 5, padding 2, zero padding counted (an edge token is divided by 5); the
--           top k = min(k, n) positions (ties to the lower index), sorted ascending.
--           Nothing is forced in (no sinks, no window).
--   pass 2  ev:restart(selected): a fresh prefill of ids[selected] at positions 0..k-1 with
--           full KV in every layer; decoding continues at k, k+1, ...
-- One shared index set, so the selected text can be shown to a person (r.restart holds the
-- selected prompt indices; ks.show_kept highlights them). Reports: selection_layer and
-- filter_layer (= layer), selected (k), and nothing when k >= n (nothing to filter).
-- Work: one (H, 1, n) score pass, one pooling and one top-k, all native.
--
-- Parameters (defaults):
--   layer  = 13    the filter layer r, 0-based (13 for Llama-3.1-8B; 19 for Mistral-Nemo-12B
--                  and Phi-3.5-mini); must be < the model's layer count
--   k      = 1024  tokens selected (the paper uses 1024, 2048, 4096)
--   kernel = 5     average-pooling kernel (odd; 1 = no pooling)
--
-- Differences from the reference:
--   * k >= n: the reference still runs pass 2 on every token; here there is no restart (the
--     same computation, so the same tokens, without the partial first pass's cost being
--     repeated). r.restart is then absent.
--   * the filter scores one prefill at a time: in a multi-turn session a later prompt is
--     filtered on its own rows (the reference has single prompts only).
--   * scores are accumulated in double and rounded once (ks.scores); torch sums float32.
--     Differences are ~1e-6 relative; exact ties (equal pooled values) still go to the lower
--     index as in the reference.
local ks = require "kvsieve"

local function check_params(p, n_layers)
  local function int(name, v, lo)
    if math.type(v) ~= "integer" then
      error(string.format("parameter %s must be an integer, got %s", name, tostring(v)), 0)
    end
    if v < lo then error(string.format("parameter %s = %d must be >= %d", name, v, lo), 0) end
  end
  int("layer", p.layer, 0)
  int("k", p.k, 1)
  int("kernel", p.kernel, 1)
  if p.kernel % 2 == 0 then error(string.format("parameter kernel = %d must be odd", p.kernel), 0) end
  if n_layers and p.layer >= n_layers then
    error(string.format("parameter layer = %d is out of range: the model has %d layers (0..%d)",
      p.layer, n_layers, n_layers - 1), 0)
  end
end

-- The filter's scores at this event: raw (n) and pooled (n) float tensors.
local function scores(ev, p)
  local raw = ks.scores(ev.q, ev.k, { rows = "last", scale = "none", reduce = "sum" })
  return raw, ks.pool1d(raw, p.kernel, "avg")
end

-- The selected row indices (ascending), or nil when every row would be kept.
local function select(ev, p)
  if p.k >= ev.n then return nil end
  local _, pooled = scores(ev, p)
  return (ks.topk(pooled, p.k)) -- sorted by index
end

return {
  name = "gemfilter",
  description = "early-layer filter: select top-k prompt tokens at one layer, prefill again on them",
  paper = "Shi et al., Discovering the Gems in Early Layers (GemFilter), arXiv:2409.17422",
  params = { layer = 13, k = 1024, kernel = 5 },

  _check_params = check_params,
  _scores = scores,
  _select = select,

  begin = function(p)
    check_params(p, ks.config and ks.config.n_layers)
  end,

  prefill_qkv = function(ev, p)
    if ev.pass ~= 0 then return end
    if ev.layer == 0 then
      check_params(p, ev.n_layers)
      -- the first pass only feeds the filter layer: when a restart is certain (k < n), its KV
      -- is not kept (the engine frees each layer's rows after its attention; peak memory)
      if p.k < ev.n and ev.pos:item(0) == 0 then ev:discard_kv() end
    end
    if ev.layer ~= p.layer then return end
    local idx = select(ev, p)
    if not idx then return end
    ev:report("selection_layer", p.layer)
    ev:report("filter_layer", p.layer)
    ev:report("selected", #idx)
    ev:restart(idx)
  end,
}
