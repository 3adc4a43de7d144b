-- asl.test.lua — tests of policies/asl.lua (run from the repository root by
-- tests/test_policies.c, or: build/kvsieve run policies/asl.test.lua).
--   1. the reference fixtures (tools/policy_ref.py): asl/{adaptive,taugt1,never}_{1pass,2pass}
--      of every model: each scored layer's top-kk set (at a top-k boundary an exact tie must go
--      to the lower positions as in the fixture, a near tie may swap), var0 and the relative
--      variances (tolerance), the selection layer / fallback, the selected positions (one pass:
--      the KV rows of the layers after the selection; two passes: the restart set), the scores
--      at the selection layer, and the generated ids (while the reference's margin is > 1e-3);
--   2. k >= n (every row selected) and tau = 0 give exactly full attention's tokens;
--   3. the fallback/deadline layer, the KV budget, and the refused configurations.
--   The fixture cases with a KV budget (asl/taugt1_1pass_kv<B>, params.kv_budget) also compare
--   every layer's kept rows per KV head (kv.layers; after the selection layer too) and the
--   pooled per-KV-head scores of kv.scores (layers running on the propagated rows).
package.path = "tests/lua/?.lua;" .. package.path
local json = require "json"
local polfix = require "polfix"

local FIX = polfix.ROOT
local NEAR_REL = 1e-4   -- a boundary this close (relative gap) may come out swapped in float32
local RATIO_TOL = 1e-4  -- relative variances (float32 here, float64 in the reference)
local SCORE_TOL = 1e-4  -- scores, relative to their maximum
local ASL = dofile("policies/asl.lua")
local below, range, eq_list, split_ints = polfix.below, polfix.range, polfix.eq_list, polfix.split_ints

-- Compare our set with the reference's given its top-k boundary: "exact", or "near" (a swap
-- across a near tie); anything else raises.
local function cmp_set(what, ours, ref, bnd) return polfix.cmp_set(what, ours, ref, bnd, NEAR_REL) end

local function close(a, b, tol) return math.abs(a - b) <= tol * math.max(math.abs(b), 1e-30) end

-- ---------------------------------------------------------------- models
local function model_for(d) return polfix.model(d.model.name), polfix.model_dir(d.model.name) end

local function params_of(d)
  local P = d.params
  return { L_min = P.L_min, L_obs = P.L_obs, tau = P.tau, k = P.k, w = P.w, kernel = P.kernel, pool = P.pool,
           two_pass = P.variant == "two_pass", kv_budget = P.kv_budget }
end

-- A KV-budget case: the policy's own per-KV-head scores at the layers of kv.scores (its file run
-- inline, handler wrapped), against the fixture's. Returns the worst relative difference.
local function check_kv_scores(d, M)
  local want = d.kv.scores.layers
  local params = {}
  for k, v in pairs(ASL.params) do params[k] = v end
  for k, v in pairs(params_of(d)) do params[k] = v end
  local got = {}
  M.s:generate(d.prompt_ids, { n = 1, policy = { params = params, begin = ASL.begin, prefill_qkv = function(ev, p)
    if want[tostring(ev.layer)] then
      local g, t = ev.n_heads // ev.n_kv_heads, {}
      for h = 0, ev.n_kv_heads - 1 do t[h + 1] = ASL._head_scores(ev.q, ev.k, h, g, ev.n, p.w, p.kernel, p.pool):tolist() end
      got[ev.layer] = t
    end
    return ASL.prefill_qkv(ev, p)
  end } })
  local worst = 0
  for ls, heads in pairs(want) do
    local l = math.tointeger(tonumber(ls))
    assert(got[l] and #got[l] == #heads, string.format("%s: no scores at layer %d", d.case, l))
    for h = 1, #heads do
      local e = polfix.rel_err(got[l][h], heads[h])
      assert(e <= SCORE_TOL, string.format("%s: KV-budget scores at layer %d head %d differ by %.3g", d.case, l, h - 1, e))
      worst = math.max(worst, e)
    end
  end
  return worst
end

-- The policy's own scoring function summed over KV heads at layer sl (an inline observer that
-- stops the pass there), against the fixture's score_at_layer.
local function check_scores(d, M)
  local sal = d.score_at_layer
  if not sal or sal == json.null then return nil end
  local P = d.params
  local got
  M.s:generate(d.prompt_ids, { n = 1, policy = { prefill_qkv = function(ev)
    if ev.layer ~= sal.layer then return end
    local g, s = ev.n_heads // ev.n_kv_heads, nil
    for h = 0, ev.n_kv_heads - 1 do
      local sh = ASL._head_scores(ev.q, ev.k, h, g, ev.n, P.w, P.kernel, P.pool)
      s = s and s + sh or sh
    end
    got = s:tolist()
    ev:stop()
  end } })
  local r = sal.s
  assert(got and #got == #r, string.format("%s: %s scores at layer %d vs %d", d.case, got and #got or 0, sal.layer, #r))
  local mx, dm = 0, 0
  for i = 1, #r do
    mx = math.max(mx, math.abs(r[i]))
    dm = math.max(dm, math.abs(got[i] - r[i]))
  end
  assert(dm <= SCORE_TOL * mx, string.format("%s: scores at layer %d differ by %.3g (max %.3g)", d.case, sal.layer, dm, mx))
  return dm / mx
end

-- ---------------------------------------------------------------- one fixture case
local function run_case(path)
  local d = json.read(path)
  local M, dir = model_for(d)
  if not M then
    print(string.format("  %-32s SKIP (model %s not found)", d.case, dir))
    return
  end
  local n, P = d.n_prompt, d.params
  local set = params_of(d)
  set.trace = true
  local r = M.s:generate(d.prompt_ids, { n = d.n_new, policy = "asl", set = set })
  local rep = r.report
  local notes, comparable = 0, true

  -- scored layers: top sets, var0, relative variances
  local last_scored = -1
  local rec_of, top_how = {}, {}
  for _, rec in ipairs(d.layers) do
    local l = rec.layer
    rec_of[l] = rec
    last_scored = l
    local top = rep["top_" .. l]
    assert(top, string.format("%s: layer %d was not scored", d.case, l))
    top_how[l] = cmp_set(string.format("%s layer %d top set", d.case, l), split_ints(top), rec.top, rec.bnd)
    if top_how[l] ~= "exact" then
      notes = notes + 1
    end
    if rec.ratio and rec.ratio ~= json.null then
      local ours = rep["relvar_" .. l]
      assert(ours and close(ours, rec.ratio, RATIO_TOL),
        string.format("%s: relative variance at layer %d is %s, the reference's %.9g", d.case, l, tostring(ours), rec.ratio))
    else
      assert(rep["relvar_" .. l] == nil, string.format("%s: layer %d < L_min has a relative variance", d.case, l))
    end
  end
  assert(rep["top_" .. (last_scored + 1)] == nil, string.format("%s: layer %d was scored after the selection", d.case, last_scored + 1))
  if d.var0 ~= json.null then
    assert(rep.var0 and close(rep.var0, d.var0, RATIO_TOL), string.format("%s: var0 %s vs %.9g", d.case, tostring(rep.var0), d.var0))
  end

  -- selection layer / fallback
  local want_sel = d.selection_layer == json.null and -1 or d.selection_layer
  assert(rep.selection_layer == want_sel,
    string.format("%s: selection layer %s, the reference's %d", d.case, tostring(rep.selection_layer), want_sel))
  assert(rep.fallback == (d.fallback == true), string.format("%s: fallback %s", d.case, tostring(rep.fallback)))
  if d.fallback then
    assert(rep.fallback_layer == d.fallback_layer, string.format("%s: fallback layer %s vs %d", d.case, tostring(rep.fallback_layer), d.fallback_layer))
  end

  -- selected positions
  local sel_layer = want_sel >= 0 and want_sel or (d.fallback and d.fallback_layer or nil)
  local L = d.model.n_layers
  if P.variant == "two_pass" then
    assert(r.restart, d.case .. ": two-pass did not restart")
    if cmp_set(d.case .. " selected (restart set)", r.restart, d.selected, rec_of[sel_layer].bnd) ~= "exact" then
      comparable = false
    end
    local k2 = #d.selected
    for l = 0, L - 1 do
      for h = 0, d.model.n_kv_heads - 1 do eq_list(below(r.kept(l, h), k2), range(0, k2), d.case .. " pass-2 KV rows") end
    end
    if comparable then
      local ids2 = {}
      for i, p in ipairs(r.restart) do ids2[i] = d.prompt_ids[p + 1] end
      eq_list(ids2, d.pass2.ids, d.case .. " pass-2 ids")
    end
  else
    assert(r.restart == nil, d.case .. ": one-pass restarted")
    local kv = d.kv ~= nil and d.kv ~= json.null and d.kv or nil
    for l = 0, L - 1 do
      for h = 0, d.model.n_kv_heads - 1 do
        local ours = below(r.kept(l, h), n)
        local post = d.selected ~= json.null and l > sel_layer
        if kv then
          -- the KV budget: every layer, after the selection too (unless the propagated rows
          -- already differ across a near tie: then not comparable)
          local rec = kv.layers[l + 1]
          local what = string.format("%s KV rows of layer %d, head %d (budget %d)", d.case, l, h, kv.budget)
          assert(rec.layer == l, what .. ": fixture layer")
          if post and top_how[sel_layer] ~= "exact" then
            comparable = false
          elseif rec.compressed then
            if cmp_set(what, ours, rec.heads[h + 1], rec.bnd[h + 1]) ~= "exact" then
              comparable = false
              notes = notes + 1
            end
          else
            eq_list(ours, post and d.selected or range(0, n), what .. ": every row")
          end
        elseif post then
          if cmp_set(string.format("%s selected (KV rows of layer %d, head %d)", d.case, l, h), ours, d.selected,
              rec_of[sel_layer].bnd) ~= "exact" then
            comparable = false
          end
        else
          eq_list(ours, range(0, n), string.format("%s layer %d: full KV", d.case, l))
        end
      end
    end
    if d.selected ~= json.null then
      assert(rep.selected_n == #d.selected, d.case .. ": selected_n")
    end
  end

  -- generated ids
  -- (while the reference's margin is > 1e-3; none after a near-tie swap)
  local upto = polfix.check_ids(r.ids, d, d.case, not comparable and 0 or nil)
  -- (the scores of pass 1 are the same in every variant: checked once per model)
  local sdiff = d.variant == "adaptive_1pass" and check_scores(d, M) or nil
  local kvdiff = d.kv ~= nil and d.kv ~= json.null and top_how[sel_layer] == "exact" and check_kv_scores(d, M) or nil
  print(string.format("  %-32s ok: %d layers scored, selection %s%s, %s selected, %s%sids %d/%d%s", d.case, #d.layers,
    tostring(want_sel), d.fallback and (" (fallback " .. d.fallback_layer .. ")") or "",
    d.selected ~= json.null and tostring(#d.selected) or "none",
    sdiff and string.format("scores at layer %d (rel diff %.1e), ", d.score_at_layer.layer, sdiff) or "",
    kvdiff and string.format("KV budget %d: %d layers' kept rows, scores (rel diff %.1e), ", d.kv.budget, L, kvdiff) or "",
    upto, #d.generated_ids, notes > 0 and string.format(", %d near-tie swaps", notes) or ""))
end

local ncases = 0
for _, c in ipairs(polfix.cases_of("asl")) do
  run_case(FIX .. "cases/" .. c.file:gsub("^cases/", ""))
  ncases = ncases + 1
end
assert(ncases >= 12, "expected asl fixture cases in the manifest, found " .. ncases)

-- ---------------------------------------------------------------- the KV budget, recomputed
-- Independent of the policy's code (plain Lua, double precision) from one layer's event data
-- `e` = { q = ev.q:tolist() (m, H, d), k = ev.k:tolist() (m, Hkv, d), m = ev.n }: KV head h's
-- SnapKV window scores (softmax of the last w queries over the keys, causal, 1/sqrt(d), summed
-- over the window, prefix 0..m-w-1), pooled per query head (stride 1, padding kernel//2, avg
-- divides by the kernel), summed over the g query heads of h.
local function budget_scores(e, h, g, w, kernel, pool)
  local Q, K, m = e.q, e.k, e.m
  local d, P, half = #Q[1][1], m - w, kernel // 2
  local scale = 1 / math.sqrt(d)
  local out = {}
  for j = 1, P do out[j] = 0 end
  for hq = h * g + 1, (h + 1) * g do
    local raw = {}
    for j = 1, P do raw[j] = 0 end
    for i = P + 1, m do -- window query rows (1-based): keys 1..i
      local qi, lg, mx, z = Q[i][hq], {}, -math.huge, 0
      for j = 1, i do
        local kj, dot = K[j][h + 1], 0
        for c = 1, d do dot = dot + qi[c] * kj[c] end
        lg[j] = dot * scale
        if lg[j] > mx then mx = lg[j] end
      end
      for j = 1, i do lg[j] = math.exp(lg[j] - mx); z = z + lg[j] end
      for j = 1, P do raw[j] = raw[j] + lg[j] / z end
    end
    for j = 1, P do
      local acc = pool == "max" and -math.huge or 0
      for o = math.max(1, j - half), math.min(P, j + half) do
        if pool == "max" then acc = math.max(acc, raw[o]) else acc = acc + raw[o] end
      end
      out[j] = out[j] + (pool == "max" and acc or acc / kernel)
    end
  end
  return out
end

-- The rows (0-based active-row indices, ascending) a KV head must keep under budget B: the top
-- (B - w) prefix rows by `sc` (ties -> the lower row) + the w window rows; and the k-th value.
local function budget_rows(sc, m, w, B)
  local order = {}
  for j = 1, #sc do order[j] = j end
  table.sort(order, function(a, b) if sc[a] ~= sc[b] then return sc[a] > sc[b] end return a < b end)
  local rows = {}
  for i = 1, B - w do rows[i] = order[i] - 1 end
  table.sort(rows)
  for i = m - w, m - 1 do rows[#rows + 1] = i end
  return rows, sc[order[B - w]]
end

-- ---------------------------------------------------------------- invariants and options
do
  local d = json.read(FIX .. "cases/llama12_gqa/asl/taugt1_1pass.json")
  local M = model_for(d)
  -- the first 400 prompt tokens (fast): still n - w > k - w, so the selections prune
  local prompt = {}
  for i = 1, 400 do prompt[i] = d.prompt_ids[i] end
  d.prompt_ids, d.n_prompt = prompt, #prompt
  local s, n, L = M.s, d.n_prompt, d.model.n_layers
  local base = params_of(d)
  local function with(t)
    local o = {}
    for k, v in pairs(base) do o[k] = v end
    for k, v in pairs(t) do o[k] = v end
    return o
  end
  local full = s:generate(d.prompt_ids, { n = 8 })
  -- k >= n: the selection keeps every row (one pass: propagates all; two passes: restarts on
  -- all at the same positions); tau = 0 one-pass selects nothing
  local cases = {
    { "one pass, k = n + w", with { k = n + base.w, tau = 1.5 } },
    { "two passes, k = 2n", with { k = 2 * n, tau = 1.5, two_pass = true } },
    { "one pass, tau = 0", with { tau = 0.0 } },
    { "one pass, kv_budget = n", with { tau = 0.0, kv_budget = n } },
  }
  for _, c in ipairs(cases) do
    local r = s:generate(d.prompt_ids, { n = 8, policy = "asl", set = c[2] })
    eq_list(r.ids, full.ids, "asl " .. c[1] .. " vs full")
  end
  -- a deadline: tau = 0 never selects, fallback_layer = 6 uses layer 6's set in one pass
  local r = s:generate(d.prompt_ids, { n = 2, policy = "asl", set = with { tau = 0.0, fallback_layer = 6, trace = true } })
  assert(r.report.selection_layer == -1 and r.report.fallback == true and r.report.fallback_layer == 6, "deadline layer 6")
  local want = split_ints(r.report.top_6)
  for i = n - base.w, n - 1 do want[#want + 1] = i end
  eq_list(below(r.kept(7, 0), n), want, "deadline: rows after layer 6 = its top set + window")
  assert(r.report.top_7 == nil, "deadline: nothing scored after it")
  -- the KV budget: per-KV-head retention at EVERY layer, the layers after the selection (run on
  -- the propagated rows) included, as the reference's compress_kv. The policy file runs inline
  -- (its handler wrapped to read each layer's q, k and rows); the sandboxed run must agree;
  -- each KV head's kept rows are recomputed here (budget_scores, budget_rows) and must match
  -- up to near-tie swaps (float32 in the engine, double here).
  local nb, nswap = 0, 0
  for _, B in ipairs({ 128, 300 }) do -- 128 < selected_n = 256 < 300 < n = 400
    local set = with { kv_budget = B }
    local Pw = dofile("policies/asl.lua")
    local params = {}
    for k, v in pairs(Pw.params) do params[k] = v end
    for k, v in pairs(set) do params[k] = v end
    local ev_of = {}
    r = s:generate(d.prompt_ids, { n = 2, policy = { params = params, begin = Pw.begin, prefill_qkv = function(ev, p)
      if ev.pass == 0 then ev_of[ev.layer] = { q = ev.q:tolist(), k = ev.k:tolist(), m = ev.n, orig = ev.orig:tolist() } end
      return Pw.prefill_qkv(ev, p)
    end } })
    local rs = s:generate(d.prompt_ids, { n = 2, policy = "asl", set = set })
    eq_list(rs.ids, r.ids, "kv_budget: sandboxed ids == inline ids")
    local sl = r.report.selection_layer
    assert(sl == base.L_min and rs.report.selection_layer == sl, "kv_budget run selects L_min")
    local g, Hkv = d.model.n_heads // d.model.n_kv_heads, d.model.n_kv_heads
    for l = 0, L - 1 do
      local e = ev_of[l]
      assert(e and e.m == (l <= sl and n or r.report.selected_n),
        string.format("kv_budget: layer %d ran %s rows", l, tostring(e and e.m)))
      for h = 0, Hkv - 1 do
        local what = string.format("kv_budget %d: layer %d head %d", B, l, h)
        local kept = below(r.kept(l, h), n)
        eq_list(below(rs.kept(l, h), n), kept, what .. ": sandboxed kept == inline kept")
        local want_n = math.min(e.m, B)
        assert(#kept == want_n and #kept <= B, string.format("%s keeps %d rows, want %d", what, #kept, want_n))
        local want = e.orig
        if e.m >= B then
          local sc = budget_scores(e, h, g, base.w, base.kernel, base.pool)
          local rows, kth = budget_rows(sc, e.m, base.w, B)
          want = {}
          for i, x in ipairs(rows) do want[i] = e.orig[x + 1] end
          local missing, extra = polfix.set_diff(kept, want)
          if #missing > 0 then
            -- a swap only across a near tie: every row in one set but not the other scores ~ the k-th
            local row_of = {}
            for x, o in ipairs(e.orig) do row_of[o] = x end
            for _, o in ipairs(missing) do extra[#extra + 1] = o end
            for _, o in ipairs(extra) do
              local v = sc[row_of[o]]
              assert(v and math.abs(v - kth) <= 1e-5 * math.abs(kth),
                string.format("%s: kept %s, expected %s (row %d scores %.9g, k-th %.9g)", what, polfix.fmt_list(kept),
                  polfix.fmt_list(want), o, v or 0 / 0, kth))
            end
            nswap = nswap + 1
          else
            nb = nb + 1
          end
        else
          eq_list(kept, want, what .. ": fewer rows than the budget: all kept")
        end
      end
    end
  end
  -- decode continues at n after a one-pass selection
  r = s:generate(d.prompt_ids, { n = 3, policy = "asl", set = base })
  local kl = r.kept(L - 1, 0)
  assert(kl[#kl] == n + 1 and kl[#kl - 1] == n, "one pass: decode rows at positions n, n+1")
  print(string.format("  %-32s ok: %d runs equal full; deadline layer; KV budget (every layer, %d kept sets recomputed, %d near-tie swaps); decode positions",
    "invariants", #cases, nb, nswap))

  -- refused configurations
  local function expect_error(pat, t)
    polfix.expect_error(pat, s.generate, s, { 1, 2, 3, 4, 5, 6, 7, 8 }, { n = 1, policy = "asl", set = t })
  end
  expect_error("L_min = 5 < L_obs - 1 = 7 is refused", { L_min = 5, L_obs = 8 })
  expect_error("L_obs must be >= 2", { L_obs = 1, L_min = 3 })
  expect_error("must exceed the window", { k = 32, w = 32 })
  expect_error("kv_budget must be 0 (off) or > w", { kv_budget = 16 })
  -- a prompt not longer than the window: nothing to rank, nothing selected
  r = s:generate({ 1, 2, 3, 4, 5 }, { n = 2, policy = "asl" })
  assert(r.report.selection_layer == -1 and r.report.fallback == false, "short prompt")
end
