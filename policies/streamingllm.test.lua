-- streamingllm.test.lua — policies/streamingllm.lua against the reference fixtures
-- (tests/fixtures/policies, tools/policy_ref.py) and its invariants. Run from the repository
-- root: `kvsieve run policies/streamingllm.test.lua` (or the policy_streamingllm test).
--   1. budget >= the prompt (and, rolling, >= prompt + generated) gives full's tokens;
--   2. every fixture case b{B} / b{B}_rolling: the rows kept after the prefill in every layer
--      and KV head, the rows resident at each decode step (rolling), generated ids (while the
--      reference's step margin is > 1e-3); rolling: the engine's KV ring (the sandboxed run)
--      gives the ids and final rows of the compacting decode_qkv handler run inline without
--      the ring, exactly;
--   3. bad parameters fail with a message naming the parameter.
package.path = "tests/lua/?.lua;" .. package.path
local polfix = require "polfix"

local POLICY = "streamingllm"
local fmt = string.format
local fail, session, range, eq_list = polfix.fail, polfix.session, polfix.range, polfix.eq_list
local check_ids = polfix.check_ids

local function concat(a, b) local t = {} for _, x in ipairs(a) do t[#t + 1] = x end for _, x in ipairs(b) do t[#t + 1] = x end return t end

local full_ids = {}
local function full(name, case)
  if not full_ids[name] then full_ids[name] = session(name):generate(case.prompt_ids, { n = case.n_new }).ids end
  return full_ids[name]
end

local cases = polfix.cases_of(POLICY)

-- ---------------------------------------------------------------- 1. budget >= n is full
do
  local case = polfix.shortest_case(cases) -- the shortest prompt of an available model
  local name, n = case and case.model.name, case and case.n_prompt
  local s = case and session(name)
  if s then
    local want = full(name, case)
    for _, set in ipairs {
      { budget = n }, { budget = n + 16 }, { budget = n + case.n_new, rolling = true },
    } do
      local r = s:generate(case.prompt_ids, { n = case.n_new, policy = POLICY, set = set })
      eq_list(r.ids, want, fmt("%s budget %d%s == full", name, set.budget, set.rolling and " rolling" or ""))
      eq_list(r.kept(0), range(0, n + case.n_new - 1), "nothing evicted")
      if r.report.compressed ~= (set.budget < n) then fail("report compressed = %s", tostring(r.report.compressed)) end
    end
    print(fmt("  %-14s budget >= n: same tokens as full (budget n, n+16, rolling n+%d)", name, case.n_new))
  end
end

-- ---------------------------------------------------------------- 2. fixture cases
local P = dofile("policies/" .. POLICY .. ".lua")
for case, s in polfix.fixture_cases(cases) do
  local n = case.n_prompt
  local pr = case.params
  local set = { budget = pr.budget, sinks = pr.sinks, rolling = pr.rolling }
  local r = s:generate(case.prompt_ids, { n = case.n_new, policy = POLICY, set = set })
  local steps = case.n_new - 1 -- decode steps (the last token is never fed back)
  local L = case.model.n_layers
  if not case.kept.compressed then fail("%s: the fixture did not compress (n < budget)", case.case) end
  if r.report.compressed ~= true then fail("%s: report compressed = %s", case.case, tostring(r.report.compressed)) end
  if not pr.rolling then
    -- after the prefill: kept positions in every layer and head, then the decode rows
    local want = concat(case.kept.positions, range(n, n + steps))
    for l = 0, L - 1 do
      for h = 0, case.model.n_kv_heads - 1 do eq_list(r.kept(l, h), want, fmt("%s layer %d head %d kept", case.case, l, h)) end
    end
  else
    -- the rows resident (and attended) at each decode step: the final state from the result,
    -- the earlier ones observed at the next step (layer 0, before its eviction, minus the
    -- row that step appended) through the same handlers run inline, without the KV ring (its
    -- begin declares none), so decode_qkv compacts at every step: the reference path
    local seen = {}
    local wrapped = {
      params = set,
      begin = function(p) P._check_params(p) end,
      prefill_qkv = P.prefill_qkv,
      decode_qkv = function(ev, p)
        if ev.layer == 0 then seen[#seen + 1] = ev:kv_pos(0):tolist() end
        P.decode_qkv(ev, p)
      end,
    }
    local r2 = s:generate(case.prompt_ids, { n = case.n_new, policy = wrapped })
    eq_list(r2.ids, r.ids, case.case .. ": compacting run inline == ring run sandboxed")
    for l = 0, L - 1 do
      for h = 0, case.model.n_kv_heads - 1 do eq_list(r2.kept(l, h), r.kept(l, h), fmt("%s layer %d head %d: ring == compacting", case.case, l, h)) end
    end
    if #seen ~= steps then fail("%s: %d decode steps seen, expected %d", case.case, #seen, steps) end
    eq_list(seen[1], concat(case.kept.positions, { n }), case.case .. ": rows after the prefill")
    for st = 0, steps - 1 do
      local dk = case.decode_kept[st + 1]
      if dk.step ~= st then fail("%s: decode_kept entry %d is step %d", case.case, st + 1, dk.step) end
      local got
      if st + 1 < steps then
        got = seen[st + 2]
        table.remove(got) -- the row step st+1 appended
      else
        got = r.kept(0)
      end
      eq_list(got, dk.positions, fmt("%s decode step %d resident rows", case.case, st))
    end
    local last = case.decode_kept[steps].positions
    for l = 0, L - 1 do
      for h = 0, case.model.n_kv_heads - 1 do eq_list(r.kept(l, h), last, fmt("%s layer %d head %d final", case.case, l, h)) end
    end
  end
  local nid = check_ids(r.ids, case, case.case)
  print(fmt("  %-34s kept sets exact in %d layers%s, %d/%d generated ids compared: ok", case.case, L,
    pr.rolling and fmt(" and %d decode steps", steps) or "", nid, #case.generated_ids))
end

-- ---------------------------------------------------------------- 3. bad parameters
do
  local s
  for _, c in ipairs(cases) do s = s or session(c.model) end
  local prompt = range(1, 40)
  local bad = polfix.bad_params(s, POLICY, prompt)
  bad({ budget = 4, sinks = 4 }, "parameter budget = 4 must exceed sinks = 4")
  bad({ budget = 2, sinks = 4 }, "parameter budget = 2 must exceed sinks = 4")
  bad({ sinks = -1 }, "parameter sinks = -1 must be >= 0")
  bad({ budget = 0 }, "parameter budget = 0 must be >= 1")
  bad({ budget = 1.5 }, "parameter budget expects an integer")
  bad({ rolling = "sometimes" }, "parameter rolling expects true or false")
  bad({ window = 3 }, "unknown parameter 'window'")
  -- sinks = 0 is a plain sliding window; budget 1 keeps only the newest row
  local r = s:generate(prompt, { n = 3, policy = POLICY, set = { budget = 5, sinks = 0, rolling = true } })
  eq_list(r.kept(0), range(#prompt - 3, #prompt + 2), "sinks = 0: a sliding window")
  print("  bad parameters: clear errors naming the parameter; sinks = 0 is a sliding window")
end
