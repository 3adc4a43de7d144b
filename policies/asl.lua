-- asl.lua — ASL, the adaptive selection layer: pick the layer at which to select tokens from
-- how stable the token ranking has become, then prune like FastKV (one pass) or GemFilter
-- (two passes).
--
-- Paper: Taniguchi, Dong, Onizuka, Xiao, "Adaptive Layer Selection for Layer-Wise Token Pruning
-- in LLM Inference" (shared/papers/asl.txt); reference code TANIGUCHIREI/ASL. Semantics:
-- shared/POLICIES.md "asl".
--
-- What it does, in prefill_qkv of each layer l of the first pass (q, k after RoPE, all n rows),
-- until a layer is selected:
--   1. Scores: SnapKV window scores per query head (fp32 softmax of the last w queries over
--      all n keys, 1/sqrt(d), causal inside the window, summed over the window) on the n - w
--      prefix positions; 1-D pooling per query head (kernel, avg by default); summed over the
--      g query heads of each KV head, then over the KV heads -> one vector s_l (n - w).
--   2. Ranks of s_l, 1 = most attended, ties -> the lower position gets the better rank; the
--      ranks and the top-kk set (kk = k - w, or n - w if smaller) of the last L_obs layers are
--      kept.
--   3. From l = L_min on: U = the union of the top-kk sets of layers l-L_obs+1..l;
--      var_l = mean over those layers and over t in U of (rank_t - mean rank of t)^2 (the
--      population variance). var0 = var at L_min, whose ratio is 1 by definition; after it the
--      relative variance is var_l / var0. The first layer whose ratio is < tau is the selection
--      layer (so tau > 1 selects L_min).
--   4. At the selection layer: selected = top-kk(s_l) union the last w positions, sorted.
--      One pass (default): ev:propagate(selected) — after this layer's MLP only these rows go
--      on, at their ORIGINAL positions (like FastKV); later layers hold full KV of them and
--      decode continues at n. Two passes (two_pass = true): ev:restart(selected) — a fresh
--      prefill of those tokens at positions 0..k'-1 (like GemFilter); decode at k'.
--   5. No layer reaches tau: one pass prunes nothing; two passes fall back to the LAST layer's
--      top-kk + window (the reference's behaviour). fallback_layer = f >= 0 changes both: if no
--      layer was selected up to layer f, layer f's set is used (a deadline).
--   Optional KV budget (kv_budget > 0, the reference's cache_k; FastKV/SnapKV-style): EVERY
--   layer of the first pass whose m rows number at least kv_budget keeps per KV head only its
--   top (kv_budget - w) prefix rows by that KV head's pooled group-summed window scores (step 1
--   over those m rows: the last w of them are the window) + the w window rows; the rest is
--   freed after the layer's attention (the prefill itself attends all m rows). That is the
--   layers on the full prompt (m = n, up to and including the selection layer) AND, in one
--   pass, the layers after the selection layer, which run on the propagated rows (m =
--   selected_n; the window is still the prompt's last w positions, always propagated) — as the
--   reference's compress_kv does at every layer once the layer is chosen. With m < kv_budget a
--   layer keeps all its rows (the reference: top (m - w) of m - w, i.e. all). Two passes: the
--   budget applies to pass 1 only, whose KV is dropped at the restart; pass 2 keeps full KV
--   (the reference's two-pass ASL runs without cache_k). POLICIES.md "asl" speaks only of the KV
--   before the selection ("with a KV budget, FastKV-style per-KV-head retention"); after it this
--   follows the reference (issue 12).
--
-- Parameters (defaults from the paper / reference):
--   L_min 10, L_obs 8, tau 0.3, k 2048 (window included), w 32, kernel 7, pool "avg" ("max"),
--   two_pass false, fallback_layer -1 (the reference's behaviour, step 5), kv_budget 0 (off),
--   trace false (true: also report each scored layer's top-kk positions as "top_<l>" strings).
--   L_min and fallback_layer must name layers of the model (checked in begin: an error otherwise).
-- Reports (every request): "selection_layer" (the layer where the ratio fell below tau, or -1),
--   "fallback" (true when a fallback/deadline layer was used) and "fallback_layer",
--   "selected_n" (rows kept), "var0", "relvar_<l>" for each l >= L_min scored, "relvar" (all
--   of them as one "l:ratio,..." string), and with trace "top_<l>".
--
-- Deliberate differences from the reference implementation:
--   - L_min < L_obs - 1 is refused with an error (the reference's lookback then wraps around its
--     list of per-layer ranks and mixes in stale layers). L_obs must be >= 2 (one layer has no
--     variance).
--   - var0 = 0 (perfectly stable ranks at L_min): a later ratio is 0 if its var is 0 too, else
--     infinite (the reference divides by zero).
--   - The fallback/deadline layer is an option (fallback_layer); the outcome is always reported.
--   - The variance is computed in float32 with double accumulation (the reference: float64 from
--     integer ranks): ratios agree to ~1e-6 relative.
--   - A prompt not longer than w has no prefix to rank: nothing is selected. A continuation
--     prefill (a session that already holds KV rows) is left alone.
local ks = require "kvsieve"

-- Pooled SnapKV window scores of KV head h over the n - w prefix positions: the sum over the
-- g query heads of h of each head's pooled probabilities -> (n - w).
local function head_scores(Q, K, h, g, n, w, kernel, pool)
  local q = Q:slice(1, h * g, (h + 1) * g)   -- (n, g, d): the query heads reading KV head h
  local k = K:slice(1, h, h + 1)             -- (n, 1, d)
  local s = ks.scores(q, k, { rows = w, causal = true, softmax = true, out = { 0, n - w } })  -- (g, n - w)
  if kernel > 1 then s = ks.pool1d(s, kernel, pool) end
  return ks.sum(s, 0)
end

-- The KV budget at one layer (ev.n >= kv_budget): each KV head keeps the top (kv_budget - w) of
-- its scores `heads[h + 1]` (head_scores over this layer's ev.n rows) + the w window rows.
local function retain_budget(ev, p, heads)
  local win = ks.arange(ev.n - p.w, ev.n)
  local lists = {}
  for h = 1, #heads do lists[h] = ks.concat((ks.topk(heads[h], p.kv_budget - p.w)), win) end
  ev:retain(lists)
end

-- Layer parameters the model does not have would silently select nothing (L_min past the last
-- layer: no layer is scored) or never fire (fallback_layer): refused, by name. Runs in begin
-- (ks.config: the model the policy was loaded for) and again at layer 0 (ev.n_layers).
local function check_layers(p, n_layers)
  for _, name in ipairs({ "L_min", "L_obs", "fallback_layer" }) do
    if math.type(p[name]) ~= "integer" then
      error(string.format("parameter %s must be an integer, got %s", name, tostring(p[name])), 0)
    end
  end
  if not n_layers then return end
  local function range(name, v)
    error(string.format("parameter %s = %d is out of range: the model has %d layers (0..%d)", name, v, n_layers,
      n_layers - 1), 0)
  end
  if p.L_min < 0 or p.L_min >= n_layers then range("L_min", p.L_min) end
  if p.fallback_layer >= n_layers then range("fallback_layer", p.fallback_layer) end
end

local state = {}

local function select_rows(ev, p, st, top, l, P, fallback)
  local sel = ks.union(top, ks.arange(P, ev.n)) -- top-kk prefix positions + the window, ascending
  st.done = true
  ks.report("selected_n", sel:numel())
  if fallback then
    ks.report("fallback", true)
    ks.report("fallback_layer", l)
  else
    ks.report("selection_layer", l)
  end
  if p.two_pass then ev:restart(sel) else ev:propagate(sel) end
end

return {
  name = "asl",
  description = "ASL: adaptive selection layer from the stability of token ranks; one-pass propagation or two-pass restart",
  paper = "Taniguchi, Dong, Onizuka, Xiao: Adaptive Layer Selection for Layer-Wise Token Pruning in LLM Inference",
  _head_scores = head_scores, -- private (tests): the pooled scores of one KV head
  params = {
    L_min = 10,
    L_obs = 8,
    tau = 0.3,
    k = 2048,
    w = 32,
    kernel = 7,
    pool = "avg",
    two_pass = false,
    fallback_layer = -1,
    kv_budget = 0,
    trace = false,
  },

  begin = function(p)
    if p.L_obs < 2 then error("asl: L_obs must be >= 2 (got " .. p.L_obs .. "): one layer has no rank variance") end
    if p.L_min < p.L_obs - 1 then
      error(string.format("asl: L_min = %d < L_obs - 1 = %d is refused: the variance at L_min looks back over L_obs "
        .. "layers (L_min-L_obs+1 .. L_min), which would start before layer 0 (the reference wraps around instead)",
        p.L_min, p.L_obs - 1))
    end
    if p.w < 1 then error("asl: w must be >= 1") end
    if p.k <= p.w then error(string.format("asl: k = %d must exceed the window w = %d (k includes the window)", p.k, p.w)) end
    if p.kernel < 1 or p.kernel % 2 == 0 then error("asl: kernel must be odd and >= 1") end
    if p.pool ~= "avg" and p.pool ~= "max" then error("asl: pool must be \"avg\" or \"max\", got \"" .. tostring(p.pool) .. "\"") end
    if p.kv_budget ~= 0 and p.kv_budget <= p.w then error("asl: kv_budget must be 0 (off) or > w") end
    check_layers(p, ks.config and ks.config.n_layers)
    state = { off = false, done = false, ranks = {}, tops = {}, var0 = nil, relvar = {} }
    ks.report("selection_layer", -1)
    ks.report("fallback", false)
  end,

  prefill_qkv = function(ev, p)
    local st = state
    if ev.pass > 0 then return end -- the second pass of two-pass ASL is plain attention
    local l, n, w = ev.layer, ev.n, p.w
    if l == 0 then
      check_layers(p, ev.n_layers)
      st.off = ev.kv_rows[1] > 0 or n <= w
    end
    if st.off then return end
    local Q, K = ev.q, ev.k
    local Hkv = ev.n_kv_heads
    local g = ev.n_heads // Hkv
    local budget = p.kv_budget > 0 and n >= p.kv_budget
    if st.done then
      -- after the selection (one pass: n = the propagated rows): only the KV budget
      if budget then
        local heads = {}
        for h = 0, Hkv - 1 do heads[h + 1] = head_scores(Q, K, h, g, n, w, p.kernel, p.pool) end
        retain_budget(ev, p, heads)
      end
      return
    end
    local P = n - w
    local kk = math.min(p.k - w, P)

    -- 1. scores: per KV head (pooled, group-summed), then summed over KV heads
    local s, heads = nil, {}
    for h = 0, Hkv - 1 do
      local sh = head_scores(Q, K, h, g, n, w, p.kernel, p.pool)
      s = s and s + sh or sh
      if budget then heads[h + 1] = sh end
    end
    if budget then retain_budget(ev, p, heads) end

    -- 2. ranks and top set of this layer; keep the last L_obs layers
    local top = ks.topk(s, kk)
    st.ranks[l], st.tops[l] = ks.rank(s), top
    st.ranks[l - p.L_obs], st.tops[l - p.L_obs] = nil, nil
    if p.trace then ks.report("top_" .. l, table.concat(ks.gather(ev.orig, top):tolist(), ",")) end

    -- 3. the relative variance of the ranks over the lookback
    if l >= p.L_min then
      local U = st.tops[l - p.L_obs + 1]
      for j = l - p.L_obs + 2, l do U = ks.union(U, st.tops[j]) end
      local X = {}
      for j = l - p.L_obs + 1, l do X[#X + 1] = ks.gather(st.ranks[j], U) end
      local var = ks.mean(ks.var(ks.stack(X):float(), 0)) -- (L_obs, |U|): population variance per t, then mean
      local ratio
      if l == p.L_min then
        st.var0, ratio = var, 1.0
        ks.report("var0", var)
      elseif st.var0 > 0 then
        ratio = var / st.var0
      else
        ratio = var == 0 and 0.0 or math.huge
      end
      ks.report("relvar_" .. l, ratio)
      st.relvar[#st.relvar + 1] = string.format("%d:%.6g", l, ratio)
      ks.report("relvar", table.concat(st.relvar, ","))
      if ratio < p.tau then
        select_rows(ev, p, st, top, l, P, false)
        return
      end
    end

    -- 5. no selection yet: a deadline / fallback layer
    local deadline = p.fallback_layer >= 0 and p.fallback_layer or (p.two_pass and ev.n_layers - 1 or nil)
    if deadline and l >= deadline then select_rows(ev, p, st, top, l, P, true) end
  end,
}
