-- fastkv.lua — FastKV: full-context prefill up to a Token-Selective Propagation (TSP) layer,
-- then only the propagated tokens; SnapKV-style KV retention per KV head at every layer.
--
-- Paper: Jo, Song, Kim, Kim, "FastKV: Decoupling of Context Reduction and KV Cache Compression
-- for Prefill-Decoding Acceleration" (shared/papers/fastkv.txt); reference code dongwonjo/FastKV.
-- Semantics: shared/POLICIES.md "fastkv". One pass, no restart.
--
-- What it does, at every prefill layer l over its m active rows (all n prompt rows up to the
-- TSP layer t, the propagated rows after it), in prefill_qkv (q, k after RoPE):
--   1. SnapKV scores per query head: fp32 softmax of the last w queries over all m keys
--      (1/sqrt(d), causal inside the window), summed over the window, prefix columns 0..m-w-1;
--      1-D pooling of each query head's row (kernel, max or avg); then summed over the g query
--      heads of each KV head -> one score row per KV head (pooling before the head sum, as the
--      reference does: max pooling does not commute with the sum).
--   2. KV retention: each KV head keeps its top (capacity - w) prefix rows + the w window rows
--      (ev:retain with per-head lists; the rest is freed after this layer's attention).
--      capacity = int(m * retain_rate) for l <= t and int(m * retain_rate / tsp_rate) after a
--      propagation (proportional mode), or the fixed `capacity` (absolute mode). A layer
--      compresses only when m >= capacity (and capacity > w).
--   3. At l = t, when that layer compresses and m > tsp_len: the per-KV-head scores summed over
--      KV heads -> top (tsp_len - w) prefix rows + the w window rows, sorted; ev:propagate(...)
--      asked in prefill_qkv applies after layer t's MLP: later layers run only these rows, at
--      their ORIGINAL positions (RoPE from them). tsp_len = int(m * tsp_rate) (proportional) or
--      the fixed `tsp_len` (absolute). Shorter prompts run full context throughout.
-- Decode continues at positions n, n+1, ... (the last prompt row is always in the window) and
-- attends the retained rows + the decode rows.
--
-- Parameters (defaults = the current release's "proportional" mode, Llama-3.1-8B's TSP layer):
--   mode         "proportional" | "absolute" (the older release: fixed sizes)
--   tsp_layer    15      t (17 for Ministral-8B, 19 for Mistral-Nemo-12B; must be < the model's
--                        layer count, checked in begin); choose it for a
--                        model with tools/fastkv_calibrate.lua (the paper's Eq. 3)
--   tsp_rate     0.2     proportional: propagate int(n * tsp_rate) rows
--   retain_rate  0.1     proportional: KV rows kept per KV head, int(m * rate) (window included)
--   tsp_len      2048    absolute: propagated rows (window included)
--   capacity     512     absolute: KV rows kept per KV head and layer (window included)
--   w            8       observation window
--   kernel       7       pooling kernel (odd; 1 = no pooling)
--   pool         "auto"  "max" | "avg" | "auto" = max in proportional mode, avg in absolute mode
--                        (what each release used)
--   trace        false   true: also report the propagated positions ("tsp_positions", a
--                        comma-separated string) for inspection and tests
-- Reports: "propagated" (boolean), "tsp_layer", "tsp_len" (rows propagated), "tsp_positions"
-- (with trace).
--
-- Deliberate differences from the reference implementation:
--   - capacity <= w (a short prompt in proportional mode): the reference fails (it asks for a
--     negative top-k); here that layer keeps its full KV. Likewise no TSP when tsp_len <= w.
--   - Layers after t use retain_rate / tsp_rate only when t really propagated; without a
--     propagation they keep retain_rate of their rows (the reference uses the layer index alone,
--     which differs only where it would fail or keep more than asked).
--   - A continuation prefill (a session that already holds KV rows) is left alone: the policy
--     compresses only the first prefill of a request.
--   - Score sums accumulate in double and round once (the reference sums in float32): only
--     near ties can come out differently; exact ties (max-pool plateaus) go to the lower index
--     as in the reference.
local ks = require "kvsieve"

-- Pooled SnapKV window scores of KV head h over the m - w prefix rows: (m - w), the sum over
-- the g query heads of h of each head's pooled probabilities.
local function head_scores(Q, K, h, g, m, w, kernel, pool)
  local q = Q:slice(1, h * g, (h + 1) * g)   -- (m, g, d): the query heads reading KV head h
  local k = K:slice(1, h, h + 1)             -- (m, 1, d)
  local s = ks.scores(q, k, { rows = w, causal = true, softmax = true, out = { 0, m - w } })  -- (g, m - w)
  if kernel > 1 then s = ks.pool1d(s, kernel, pool) end
  return ks.sum(s, 0)
end

-- A TSP layer the model does not have would silently propagate nothing: refused, by name. Runs
-- in begin (ks.config: the model the policy was loaded for) and again at layer 0 (ev.n_layers:
-- the model it runs on).
local function check_layers(p, n_layers)
  if math.type(p.tsp_layer) ~= "integer" then
    error(string.format("parameter tsp_layer must be an integer, got %s", tostring(p.tsp_layer)), 0)
  end
  if p.tsp_layer < 0 or (n_layers and p.tsp_layer >= n_layers) then
    error(string.format("parameter tsp_layer = %d is out of range: the model has %s layers (0..%s)",
      p.tsp_layer, tostring(n_layers or "?"), n_layers and tostring(n_layers - 1) or "?"), 0)
  end
end

local state = {}

return {
  name = "fastkv",
  description = "FastKV: full context up to the TSP layer, then only the propagated tokens; per-KV-head SnapKV retention",
  paper = "Jo, Song, Kim, Kim: FastKV: Decoupling of Context Reduction and KV Cache Compression for Prefill-Decoding Acceleration",
  _head_scores = head_scores, -- private (tests): the pooled scores of one KV head
  params = {
    mode = "proportional",
    tsp_layer = 15,
    tsp_rate = 0.2,
    retain_rate = 0.1,
    tsp_len = 2048,
    capacity = 512,
    w = 8,
    kernel = 7,
    pool = "auto",
    trace = false,
  },

  begin = function(p)
    if p.mode ~= "proportional" and p.mode ~= "absolute" then
      error("fastkv: mode must be \"proportional\" or \"absolute\", got \"" .. tostring(p.mode) .. "\"")
    end
    if p.pool ~= "auto" and p.pool ~= "max" and p.pool ~= "avg" then
      error("fastkv: pool must be \"auto\", \"max\" or \"avg\", got \"" .. tostring(p.pool) .. "\"")
    end
    if p.w < 1 then error("fastkv: w must be >= 1") end
    if p.kernel < 1 or p.kernel % 2 == 0 then error("fastkv: kernel must be odd and >= 1") end
    if p.mode == "proportional" and not (p.tsp_rate > 0 and p.retain_rate > 0) then
      error("fastkv: tsp_rate and retain_rate must be > 0")
    end
    check_layers(p, ks.config and ks.config.n_layers)
    state = { off = false, propagated = false }
    ks.report("propagated", false)
  end,

  prefill_qkv = function(ev, p)
    local st = state
    local l, m, w = ev.layer, ev.n, p.w
    if l == 0 then
      if ev.pass == 0 then check_layers(p, ev.n_layers) end
      st.off = ev.pass ~= 0 or ev.kv_rows[1] > 0 -- continuation prefill: leave it
    end
    if st.off then return end
    local prop = p.mode == "proportional"
    local cap
    if prop then
      cap = math.floor(m * (st.propagated and p.retain_rate / p.tsp_rate or p.retain_rate))
    else
      cap = p.capacity
    end
    if not (m >= cap and cap > w) then return end -- this layer keeps its full KV (and no TSP)
    local tsp_len
    if l == p.tsp_layer and not st.propagated then
      tsp_len = prop and math.floor(m * p.tsp_rate) or p.tsp_len
      if not (m > tsp_len and tsp_len > w) then tsp_len = nil end
    end

    local pool = p.pool == "auto" and (prop and "max" or "avg") or p.pool
    local Q, K = ev.q, ev.k
    local Hkv = ev.n_kv_heads
    local g = ev.n_heads // Hkv
    local win = ks.arange(m - w, m)
    local lists, total = {}, nil
    for h = 0, Hkv - 1 do
      local s = head_scores(Q, K, h, g, m, w, p.kernel, pool)
      lists[h + 1] = ks.concat((ks.topk(s, cap - w)), win)
      if tsp_len then total = total and total + s or s end
    end
    ev:retain(lists)

    if tsp_len then
      local sel = ks.concat((ks.topk(total, tsp_len - w)), win) -- ascending: prefix picks, then the window
      ev:propagate(sel)                                        -- applies after this layer's MLP
      st.propagated = true
      ks.report("propagated", true)
      ks.report("tsp_layer", l)
      ks.report("tsp_len", tsp_len)
      if p.trace then ks.report("tsp_positions", table.concat(ks.gather(ev.orig, sel):tolist(), ",")) end
    end
  end,
}
