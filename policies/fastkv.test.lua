-- fastkv.test.lua — tests of policies/fastkv.lua (run from the repository root by
-- tests/test_policies.c, or: build/kvsieve run policies/fastkv.test.lua).
--   1. budget >= prompt: absolute mode with capacity n + 1, and proportional mode with rates 1,
--      give exactly full attention's tokens and keep every row; a short prompt in proportional
--      mode (capacity <= w) runs full context;
--   2. the reference fixtures (tools/policy_ref.py): fastkv/prop_t{t} and abs_t{t} of every
--      model: the KV positions kept per layer and KV head (original positions; at a top-k
--      boundary an exact tie must go to the lower positions as in the fixture, a near tie may
--      swap), the TSP layer's propagated set, the rows each layer ran, and the generated ids
--      (while the reference's greedy margin is > 1e-3);
--   3. parameter errors.
package.path = "tests/lua/?.lua;" .. package.path
local json = require "json"
local polfix = require "polfix"

local FIX = polfix.ROOT
local NEAR_REL = 1e-4 -- a boundary this close (relative gap) may come out swapped in float32
local below, range, eq_list, split_ints = polfix.below, polfix.range, polfix.eq_list, polfix.split_ints

-- Compare our kept set with the reference's, given the reference's top-k boundary. Returns
-- "exact", or "near" (a swap across a near tie: later results are no longer comparable).
local function cmp_set(what, ours, ref, bnd) return polfix.cmp_set(what, ours, ref, bnd, NEAR_REL) end

-- ---------------------------------------------------------------- fixtures
local function model_for(d) return polfix.model(d.model.name), polfix.model_dir(d.model.name) end

-- The policy's own scoring function (a private field of its table), run by an inline
-- observer that replays the reference's propagation: per KV head pooled group-summed scores
-- at the fixture's score layers, within a relative tolerance.
local FASTKV = dofile("policies/fastkv.lua")
local SCORE_TOL = 1e-4

local function check_scores(d, M)
  local P, t = d.params, d.params.tsp_layer
  local want = d.scores.layers
  local pool = P.pool
  local worst, nl = 0, 0
  local errs = {}
  M.s:generate(d.prompt_ids, { n = 1, policy = { prefill_qkv = function(ev)
    local ref = want[tostring(ev.layer)]
    if ref then
      nl = nl + 1
      local g = ev.n_heads // ev.n_kv_heads
      for h = 0, ev.n_kv_heads - 1 do
        local s = FASTKV._head_scores(ev.q, ev.k, h, g, ev.n, P.w, P.kernel, pool):tolist()
        local r = ref[h + 1]
        if #s ~= #r then errs[#errs + 1] = string.format("layer %d head %d: %d scores vs %d", ev.layer, h, #s, #r)
        else
          local mx, dm = 0, 0
          for i = 1, #r do
            mx = math.max(mx, math.abs(r[i]))
            dm = math.max(dm, math.abs(s[i] - r[i]))
          end
          worst = math.max(worst, dm / mx)
        end
      end
    end
    if ev.layer == t and d.tsp.propagated then ev:propagate(d.tsp.positions) end
  end } })
  assert(#errs == 0, d.case .. " scores: " .. table.concat(errs, "; "))
  assert(worst <= SCORE_TOL, string.format("%s: pooled scores differ from the reference's by %.3g (relative to the max)", d.case, worst))
  return nl, worst
end

local function run_case(path)
  local d = json.read(path)
  local M, dir = model_for(d)
  if not M then
    print(string.format("  %-38s SKIP (model %s not found)", d.case, dir))
    return
  end
  local n, P = d.n_prompt, d.params
  local set = { trace = true }
  for k, v in pairs(P) do set[k] = v end
  local r = M.s:generate(d.prompt_ids, { n = d.n_new, policy = "fastkv", set = set })
  local t = P.tsp_layer
  local notes, comparable = 0, true
  -- the TSP set
  local tsp = d.tsp
  if tsp.propagated then
    assert(r.report.propagated == true, d.case .. ": the reference propagates at layer " .. t .. ", we did not")
    assert(r.report.tsp_layer == t and r.report.tsp_len == tsp.tsp_len,
      string.format("%s: TSP at layer %s with %s rows, the reference at %d with %d", d.case, tostring(r.report.tsp_layer),
        tostring(r.report.tsp_len), t, tsp.tsp_len))
    if cmp_set(d.case .. " TSP set", split_ints(r.report.tsp_positions), tsp.positions, tsp.bnd) ~= "exact" then
      comparable, notes = false, notes + 1
    end
  else
    assert(r.report.propagated == false, d.case .. ": we propagated, the reference did not")
  end
  -- kept KV per layer and KV head; rows each layer ran
  local checked = 0
  for _, L in ipairs(d.layers) do
    local l = L.layer
    if not comparable and l > t then break end
    local ran = l == 0 and n or r.active_rows[l] -- rows going on after layer l - 1
    assert(ran == L.n_active, string.format("%s: layer %d ran %d rows, the reference %d", d.case, l, ran, L.n_active))
    for h = 0, d.model.n_kv_heads - 1 do
      local ours = below(r.kept(l, h), n)
      local what = string.format("%s layer %d KV head %d", d.case, l, h)
      if L.heads == json.null then
        local all = (l > t and tsp.propagated) and tsp.positions or range(0, n)
        eq_list(ours, all, what .. " (not compressed: every active row)")
      else
        if cmp_set(what, ours, L.heads[h + 1], L.bnd[h + 1]) ~= "exact" then notes = notes + 1 end
      end
      checked = checked + 1
    end
    if L.active_orig and L.active_orig ~= json.null then
      eq_list(L.active_orig, tsp.positions, d.case .. " active rows after the TSP layer (fixture self-check)")
    end
  end
  -- generated ids while the reference's margin is comfortable (a KV set that swapped across
  -- a near tie changes decoding: then only the first token, which comes from the prefill)
  local upto = polfix.check_ids(r.ids, d, d.case, (not comparable and 0) or (notes > 0 and 1) or nil)
  local nl, worst = check_scores(d, M)
  print(string.format("  %-38s ok: %d (layer, head) sets, TSP %s (%s rows), scores of %d layers (max rel diff %.1e), ids %d/%d%s",
    d.case, checked, tsp.propagated and ("at " .. t) or "none", tostring(tsp.tsp_len), nl, worst, upto, #d.generated_ids,
    notes > 0 and string.format(", %d near-tie swaps", notes) or ""))
end

local ncases = 0
for _, c in ipairs(polfix.cases_of("fastkv")) do
  run_case(FIX .. "cases/" .. c.file:gsub("^cases/", ""))
  ncases = ncases + 1
end
assert(ncases >= 4, "expected fastkv fixture cases in the manifest, found " .. ncases)

-- ---------------------------------------------------------------- budget >= prompt == full
do
  local d = json.read(FIX .. "cases/llama12_gqa/fastkv/prop_t5.json")
  local M = model_for(d)
  local n = d.n_prompt
  local full = M.s:generate(d.prompt_ids, { n = 8 })
  local cases = {
    { name = "absolute, capacity n+1", set = { mode = "absolute", capacity = n + 1, tsp_len = n // 2, tsp_layer = 5 } },
    { name = "proportional, rates 1", set = { tsp_rate = 1.0, retain_rate = 1.0, tsp_layer = 5 } },
    { name = "absolute, capacity n (every row kept)", set = { mode = "absolute", capacity = n, tsp_len = n, tsp_layer = 5 } },
  }
  for _, c in ipairs(cases) do
    local r = M.s:generate(d.prompt_ids, { n = 8, policy = "fastkv", set = c.set })
    eq_list(r.ids, full.ids, "fastkv " .. c.name .. " vs full")
    assert(r.report.propagated == false, c.name .. ": nothing should be propagated")
    for l = 0, d.model.n_layers - 1 do
      for h = 0, d.model.n_kv_heads - 1 do eq_list(below(r.kept(l, h), n), range(0, n), c.name .. " kept") end
    end
  end
  -- a short prompt in proportional mode: capacity int(60 * 0.1) = 6 <= w: full context throughout
  local short = {}
  for i = 1, 60 do short[i] = d.prompt_ids[i] end
  local f = M.s:generate(short, { n = 6 })
  local r = M.s:generate(short, { n = 6, policy = "fastkv", set = { tsp_layer = 2 } })
  eq_list(r.ids, f.ids, "fastkv short prompt vs full")
  assert(r.report.propagated == false and r.active_rows[12] == 60, "short prompt: no propagation")
  -- decode positions continue at n after a propagation
  r = M.s:generate(d.prompt_ids, { n = 3, policy = "fastkv", set = { tsp_layer = 5 } })
  local k11 = r.kept(11, 0)
  assert(k11[#k11] == n + 1 and k11[#k11 - 1] == n, "decode rows at positions n, n+1")
  print(string.format("  %-38s ok: %d budget >= n cases equal full; short prompt runs full context", "invariants", #cases))

  -- parameter errors
  local function expect_error(pat, set)
    polfix.expect_error(pat, M.s.generate, M.s, short, { n = 1, policy = "fastkv", set = set })
  end
  expect_error("mode must be", { mode = "pyramid" })
  expect_error("pool must be", { pool = "min" })
  expect_error("kernel must be odd", { kernel = 4 })
end

-- ---------------------------------------------------------------- the calibration tool (smoke test)
do
  local lines = {}
  local real_print = print
  print = function(...) lines[#lines + 1] = table.concat({ ... }, "\t") end -- luacheck: ignore
  local ok, e = pcall(assert(loadfile("tools/fastkv_calibrate.lua")), FIX .. "models/llama12_gqa", "--random", "1",
    "--len", "300", "--tmin", "2", "--lmax", "4", "--threads", "1", "--policy", "policies/fastkv.lua")
  print = real_print -- luacheck: ignore
  assert(ok, "tools/fastkv_calibrate.lua: " .. tostring(e))
  local out = table.concat(lines, "\n")
  local t = out:match("use: %-%-policy fastkv %-%-set tsp_layer=(%d+)")
  assert(t and tonumber(t) >= 2 and tonumber(t) <= 4, "calibration output lacks a choice:\n" .. out)
  assert(select(2, out:gsub("\n%s+[234]%s+0%.%d+", "")) == 3, "calibration table lacks rows for t = 2..4:\n" .. out)
  print(string.format("  %-38s ok: tools/fastkv_calibrate.lua chose t = %s of 2..4", "calibration", t))
end
