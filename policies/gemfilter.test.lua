-- gemfilter.test.lua — policies/gemfilter.lua against the reference fixtures
-- (tests/fixtures/policies, tools/policy_ref.py) and its invariants. Run from the repository
-- root: `kvsieve run policies/gemfilter.test.lua` (or the policy_gemfilter test).
--   1. k >= n gives full's tokens (and no restart);
--   2. every fixture case r{r}_k{k}: the score vectors (raw and pooled, within 1e-4 of
--      the vector's scale),
--      the selected positions (a set; exact ties to the lower index, near ties may swap),
--      the restart indices, the reports, generated ids (while the step margin is > 1e-3);
--   3. bad parameters fail with a message naming the parameter.
package.path = "tests/lua/?.lua;" .. package.path
local ks = require "kvsieve"
local polfix = require "polfix"

local POLICY = "gemfilter"
local manifest = polfix.manifest()
local fmt = string.format
local fail, session, range, eq_list = polfix.fail, polfix.session, polfix.range, polfix.eq_list
local check_ids, expect_error, check_topk, rel_err = polfix.check_ids, polfix.expect_error, polfix.check_topk, polfix.rel_err

local cases = polfix.cases_of(POLICY)

-- ---------------------------------------------------------------- 1. k >= n is full
do
  local case = polfix.shortest_case(cases) -- the shortest prompt of an available model
  local name, n = case and case.model.name, case and case.n_prompt
  local s = case and session(name)
  if s then
    local want = s:generate(case.prompt_ids, { n = case.n_new }).ids
    eq_list(want, case.full_generated_ids, name .. ": full run vs the fixture's full ids")
    for _, k in ipairs { n, n + 1, 100000 } do
      local r = s:generate(case.prompt_ids, { n = case.n_new, policy = POLICY, set = { layer = case.filter_layer, k = k } })
      eq_list(r.ids, want, fmt("%s k = %d == full", name, k))
      if r.restart then fail("%s k = %d: restarted", name, k) end
    end
    print(fmt("  %-14s k >= n: same tokens as full, no restart (k = n, n+1, 100000)", name))
  end
end

-- ---------------------------------------------------------------- 2. fixture cases
local P = dofile("policies/" .. POLICY .. ".lua")
for case, s in polfix.fixture_cases(cases) do
  local n = case.n_prompt
  local pr = case.params
  if pr.kernel ~= 5 or pr.pool ~= "avg" or not pr.count_include_pad then fail("%s: unexpected params", case.case) end
  local set = { layer = case.filter_layer, k = pr.k }
  local r = s:generate(case.prompt_ids, { n = case.n_new, policy = POLICY, set = set })
  -- the scores, from the policy's own functions run inline at the filter layer
  local raw, pooled, sel
  local params = { layer = set.layer, k = set.k, kernel = 5 }
  local r2 = s:generate(case.prompt_ids, { n = case.n_new, policy = {
    params = params,
    prefill_qkv = function(ev, p)
      if ev.pass == 0 and ev.layer == p.layer then
        local a, b = P._scores(ev, p)
        raw, pooled = a:tolist(), b:tolist()
        sel = P._select(ev, p):tolist()
      end
      return P.prefill_qkv(ev, p)
    end } })
  eq_list(r2.ids, r.ids, case.case .. ": inline run == sandboxed run")
  local e_raw, e_pool = rel_err(raw, case.score_raw), rel_err(pooled, case.score_pooled)
  if e_raw > 1e-4 then fail("%s: score_raw differs by %.3g relative", case.case, e_raw) end
  if e_pool > 1e-4 then fail("%s: score_pooled differs by %.3g relative", case.case, e_pool) end
  eq_list(r.restart, sel, case.case .. ": restart indices == the selection")
  local how = check_topk(r.restart, case.selected, case.bnd, case.case .. " selected",
    function(x) return case.score_pooled[x + 1] end)
  local rep = r.report
  if rep.selection_layer ~= set.layer or rep.filter_layer ~= set.layer or rep.selected ~= pr.k then
    fail("%s: reports selection_layer %s filter_layer %s selected %s", case.case, tostring(rep.selection_layer),
      tostring(rep.filter_layer), tostring(rep.selected))
  end
  if r.selection_layer ~= set.layer then fail("%s: r.selection_layer %s", case.case, tostring(r.selection_layer)) end
  -- pass 2 holds exactly the k selected tokens, renumbered 0..k-1
  eq_list(r.kept(0), range(0, pr.k + case.n_new - 1), case.case .. ": pass-2 positions")
  local nid = "not compared (the selection differs at a near tie)"
  if how == "exact" then
    for i, j in ipairs(r.restart) do
      if case.prompt_ids[j + 1] ~= case.pass2.ids[i] then fail("%s: pass-2 id %d", case.case, i) end
    end
    nid = fmt("%d/%d generated ids compared", check_ids(r.ids, case, case.case), #case.generated_ids)
  end
  local tie = polfix.tie_note(case.bnd)
  print(fmt("  %-28s scores within %.1e / %.1e relative, selection %s%s, %s: ok", case.case, e_raw, e_pool, how, tie, nid))
end

-- ---------------------------------------------------------------- 3. bad parameters
do
  local s, L
  for _, c in ipairs(cases) do
    if not s and session(c.model) then s, L = session(c.model), manifest.models[c.model].n_layers end
  end
  local prompt = range(1, 40)
  local bad = polfix.bad_params(s, POLICY, prompt)
  bad({ layer = L }, fmt("parameter layer = %d is out of range: the model has %d layers", L, L))
  bad({}, "parameter layer = 13 is out of range") -- the default is for 32-layer models
  bad({ layer = -1 }, "parameter layer = -1 must be >= 0")
  bad({ layer = 1, k = 0 }, "parameter k = 0 must be >= 1")
  bad({ layer = 1, k = -5 }, "parameter k = -5 must be >= 1")
  bad({ layer = 1, kernel = 4 }, "parameter kernel = 4 must be odd")
  bad({ layer = 1, k = "many" }, "parameter k expects an integer")
  bad({ r = 3 }, "unknown parameter 'r'")
  -- a policy loaded without a model (no config at begin) checks the layer at the first event
  local pol = ks.policy(POLICY, { layer = L + 5 })
  expect_error(fmt("parameter layer = %d is out of range", L + 5), function() return s:generate(prompt, { n = 1, policy = pol }) end)
  pol:close()
  -- k = 1 keeps one token; kernel 1 is no pooling
  local r = s:generate(prompt, { n = 2, policy = POLICY, set = { layer = 1, k = 1, kernel = 1 } })
  if #r.restart ~= 1 then fail("k = 1 selected %d", #r.restart) end
  print("  bad parameters: clear errors naming the parameter; k = 1 and kernel 1 work")
end
