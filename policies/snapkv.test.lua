-- snapkv.test.lua — policies/snapkv.lua against the reference fixtures (tests/fixtures/policies,
-- tools/policy_ref.py) and its invariants. Run from the repository root:
-- `kvsieve run policies/snapkv.test.lua` (or the policy_snapkv test).
--   1. budget >= n gives full's tokens (budget n: everything selected; n+5: no compression);
--   2. every fixture case w{w}_k{kernel}_{pool}_b{B}[_pqh], every layer:
--      kv_head granularity — the rows kept per KV head (sets: exact ties to the lower index,
--        near ties may swap), the pooled scores of the fixture's layers (within 1e-4 of their
--        scale), generated ids (while the step margin is > 1e-3);
--      query_head (`_pqh`, per_query_head = true) — the policy's set for each QUERY head equals
--        the reference's, and each KV head's cache holds exactly the union of its query
--        heads' sets (what the policy retains: our cache has no per-query-head copies, see
--        snapkv.lua); generated ids: only the first (from the unchanged prefill) must match,
--        the others are printed (a query head also sees its siblings' rows here);
--   3. bad parameters fail with a message naming the parameter.
package.path = "tests/lua/?.lua;" .. package.path
local json = require "json"
local polfix = require "polfix"

local POLICY = "snapkv"
local fmt = string.format
local fail, session, range, eq_list = polfix.fail, polfix.session, polfix.range, polfix.eq_list
local check_ids, check_topk, rel_err = polfix.check_ids, polfix.check_topk, polfix.rel_err
local split, union = polfix.split, polfix.union -- split a kept list at n; the sorted union of lists

local cases = polfix.cases_of(POLICY)

-- ---------------------------------------------------------------- 1. budget >= n is full
do
  local case = polfix.shortest_case(cases) -- the shortest prompt of an available model
  local name, n = case and case.model.name, case and case.n_prompt
  local s = case and session(name)
  if s then
    local want = s:generate(case.prompt_ids, { n = case.n_new }).ids
    eq_list(want, case.full_generated_ids, name .. ": full run vs the fixture's full ids")
    for _, set in ipairs { { budget = n }, { budget = n + 5 }, { budget = n, per_query_head = true } } do
      local r = s:generate(case.prompt_ids, { n = case.n_new, policy = POLICY, set = set })
      local what = fmt("%s budget %d%s", name, set.budget, set.per_query_head and " per query head" or "")
      eq_list(r.ids, want, what .. " == full")
      eq_list(r.kept(0), range(0, n + case.n_new - 1), what .. ": every row kept")
      if r.report.compressed ~= (set.budget <= n) then fail("%s: report compressed = %s", what, tostring(r.report.compressed)) end
    end
    print(fmt("  %-14s budget >= n: same tokens as full (budget n, n+5, n per query head)", name))
  end
end

-- ---------------------------------------------------------------- 2. fixture cases
local P = dofile("policies/" .. POLICY .. ".lua")
for case, s in polfix.fixture_cases(cases) do
  local n = case.n_prompt
  local pr = case.params
  local pqh = pr.granularity == "query_head"
  local set = { budget = pr.budget, window = pr.window, kernel = pr.kernel, pool = pr.pool, per_query_head = pqh }
  local L, H, Hkv = case.model.n_layers, case.model.n_heads, case.model.n_kv_heads
  local steps = case.n_new - 1
  -- the policy's own handler run inline, recording what its functions compute: the pooled
  -- scores of the fixture's layers and the selected set of each cache (or query) head
  local got_scores, got_sets = {}, {}
  local r = s:generate(case.prompt_ids, { n = case.n_new, policy = { params = set, prefill_qkv = function(ev, p)
    if case.scores.layers[tostring(ev.layer)] then got_scores[ev.layer] = P._scores(ev, p):tolist() end
    got_sets[ev.layer] = {}
    for h, t in ipairs(P._select(ev, p)) do got_sets[ev.layer][h] = t:tolist() end
    return P.prefill_qkv(ev, p)
  end } })
  if r.report.compressed ~= true then fail("%s: not compressed", case.case) end
  -- the file itself, sandboxed (the per-query-head cases; the default path is compared on
  -- a short prompt in part 3): the same tokens and the same cache
  if pqh then
    local r2 = s:generate(case.prompt_ids, { n = case.n_new, policy = POLICY, set = set })
    eq_list(r2.ids, r.ids, case.case .. ": sandboxed ids == inline ids")
    for l = 0, L - 1 do
      for kv = 0, Hkv - 1 do eq_list(r2.kept(l, kv), r.kept(l, kv), fmt("%s: sandboxed kept, layer %d KV head %d", case.case, l, kv)) end
    end
  end
  local worst, swaps, ties = 0, 0, 0
  for _, lay in ipairs(case.kept.layers) do
    local l = lay.layer
    if not lay.compressed then fail("%s layer %d: the fixture did not compress", case.case, l) end
    local ref_scores = case.scores.layers[tostring(l)]
    if ref_scores then
      for h = 1, #ref_scores do
        worst = math.max(worst, rel_err(got_scores[l][h], ref_scores[h]))
      end
    end
    local nsets = pqh and H or Hkv
    if #lay.heads ~= nsets or #got_sets[l] ~= nsets then fail("%s layer %d: %d / %d sets", case.case, l, #lay.heads, #got_sets[l]) end
    local window = range(n - pr.window, n)
    for h = 1, nsets do
      local what = fmt("%s layer %d %s head %d", case.case, l, pqh and "query" or "KV", h - 1)
      local want_prefix, want_win = split(lay.heads[h], n - pr.window)
      local got_prefix, got_win = split(got_sets[l][h], n - pr.window)
      eq_list(got_win, window, what .. " window")
      eq_list(want_win, window, what .. " fixture window")
      local value = ref_scores and function(x) return ref_scores[h][x + 1] end
      local how = check_topk(got_prefix, want_prefix, lay.bnd[h], what, value)
      if how ~= "exact" then swaps = swaps + 1 end
      if lay.bnd[h] ~= json.null and lay.bnd[h].exact_tie then ties = ties + 1 end
    end
    -- what the cache holds per KV head: the selection (the union of the query heads' sets
    -- with per_query_head), then every decoded row
    local g = nsets // Hkv
    for kv = 0, Hkv - 1 do
      local mine = {}
      for j = 1, g do mine[j] = got_sets[l][kv * g + j] end
      local held, dec = split(r.kept(l, kv), n)
      eq_list(held, union(mine), fmt("%s layer %d KV head %d: cache == selection", case.case, l, kv))
      eq_list(dec, range(n, n + steps), fmt("%s layer %d KV head %d: decode rows", case.case, l, kv))
      if pqh and swaps == 0 then
        local ref = {}
        for j = 1, g do ref[j] = lay.heads[kv * g + j] end
        eq_list(held, union(ref), fmt("%s layer %d KV head %d: cache == union of the reference's sets", case.case, l, kv))
      end
    end
  end
  if worst > 1e-4 then fail("%s: pooled scores differ by %.3g of their scale", case.case, worst) end
  local ids
  if swaps > 0 then
    ids = "ids not compared (a near tie swapped)"
  elseif pqh then
    if r.ids[1] ~= case.generated_ids[1] then fail("%s: first id %d, expected %d", case.case, r.ids[1], case.generated_ids[1]) end
    local same = 0
    for i = 1, #case.generated_ids do if r.ids[i] == case.generated_ids[i] then same = same + 1 end end
    ids = fmt("first id equal, %d/%d ids equal (union per KV head)", same, #case.generated_ids)
  else
    ids = fmt("%d/%d ids compared", check_ids(r.ids, case, case.case), #case.generated_ids)
  end
  print(fmt("  %-38s %d layers x %d sets exact (%d exact ties, %d near-tie swaps), scores within %.1e, %s: ok",
    case.case, L, pqh and H or Hkv, ties, swaps, worst, ids))
end

-- ---------------------------------------------------------------- 3. bad parameters
do
  local s
  for _, c in ipairs(cases) do s = s or session(c.model) end
  local prompt = range(1, 40)
  local bad = polfix.bad_params(s, POLICY, prompt)
  bad({ budget = 32 }, "parameter budget = 32 must exceed window = 32")
  bad({ budget = 8, window = 16 }, "parameter budget = 8 must exceed window = 16")
  bad({ window = 0 }, "parameter window = 0 must be >= 1")
  bad({ kernel = 6 }, "parameter kernel = 6 must be odd")
  bad({ kernel = 0 }, "parameter kernel = 0 must be >= 1")
  bad({ pool = "mean" }, "parameter pool = \"mean\" must be \"max\" or \"avg\"")
  bad({ budget = "all" }, "parameter budget expects an integer")
  bad({ per_query_head = "x" }, "parameter per_query_head expects true or false")
  bad({ capacity = 3 }, "unknown parameter 'capacity'")
  -- a small budget on a short prompt (window 4, budget 10: 6 prefix rows + 4 window rows), the
  -- file sandboxed and its handler inline: the same rows and tokens
  local set = { budget = 10, window = 4, kernel = 3 }
  local r = s:generate(prompt, { n = 3, policy = POLICY, set = set })
  local params = { budget = 10, window = 4, kernel = 3, pool = "max", per_query_head = false }
  local r2 = s:generate(prompt, { n = 3, policy = { params = params, prefill_qkv = P.prefill_qkv } })
  eq_list(r.ids, r2.ids, "budget 10: sandboxed ids == inline ids")
  for l = 0, r.n_layers - 1 do
    for kv = 0, r.n_kv_heads - 1 do
      local held = split(r.kept(l, kv), #prompt)
      if #held ~= 10 then fail("budget 10 kept %d rows", #held) end
      eq_list(r.kept(l, kv), r2.kept(l, kv), fmt("budget 10: sandboxed kept == inline, layer %d KV head %d", l, kv))
    end
  end
  print("  bad parameters: clear errors naming the parameter; budget 10 sandboxed == inline")
end
