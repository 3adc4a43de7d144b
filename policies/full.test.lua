-- full.test.lua — policies/full.lua: the baseline. Run from the repository root:
-- `kvsieve run policies/full.test.lua` (or the policy_full test).
--   1. it defines no handler (so it costs nothing) and no parameter;
--   2. for every model of the reference fixtures (tests/fixtures/policies, tools/policy_ref.py):
--      the same tokens as the engine with no policy, and the fixture's full generated_ids
--      (compared while the reference's step margin is > 1e-3); every row kept;
--   3. a parameter it does not have is a clear error naming it.
package.path = "tests/lua/?.lua;" .. package.path
local json = require "json"
local polfix = require "polfix"

local POLICY = "full"
local ROOT = polfix.ROOT
local fmt = string.format
local fail, range, eq_list, check_ids = polfix.fail, polfix.range, polfix.eq_list, polfix.check_ids

-- ---------------------------------------------------------------- 1. no handlers, no params
local P = dofile("policies/" .. POLICY .. ".lua")
for _, h in ipairs { "begin", "prefill_qkv", "prefill_layer_end", "prefill_end", "decode_qkv", "token" } do
  if P[h] ~= nil then fail("full defines the handler %s (it must cost nothing)", h) end
end
if next(P.params or {}) ~= nil then fail("full has parameters") end
print("  no handlers, no parameters")

-- ---------------------------------------------------------------- 2. every model
local s_any
local n_cases = 0
for _, entry in ipairs(polfix.cases_of(POLICY)) do
  n_cases = n_cases + 1
  local case = json.read(ROOT .. entry.file)
  local name, n = case.model.name, case.n_prompt
  local s = polfix.session(name)
  if not s then
    print(fmt("  %-24s skipped: model folder %s is absent", case.case, polfix.model_dir(name)))
  else
    s_any = s_any or s
    local plain = s:generate(case.prompt_ids, { n = case.n_new })
    local r = s:generate(case.prompt_ids, { n = case.n_new, policy = POLICY })
    eq_list(r.ids, plain.ids, case.case .. ": full == no policy")
    eq_list(case.generated_ids, case.full_generated_ids, case.case .. ": the fixture's own full ids")
    local nid = check_ids(r.ids, case, case.case)
    for l = 0, case.model.n_layers - 1 do eq_list(r.kept(l), range(0, n + case.n_new - 1), case.case .. " kept") end
    if r.policy ~= "full" or next(r.report) ~= nil then fail("%s: policy %s, reports", case.case, tostring(r.policy)) end
    print(fmt("  %-24s same ids as no policy, %d/%d fixture ids compared, every row kept: ok", case.case, nid, #case.generated_ids))
  end
end
if n_cases == 0 then error("no full cases in the fixture manifest") end

-- ---------------------------------------------------------------- 3. bad parameters
if s_any then
  local ok, e = pcall(function() return s_any:generate({ 1, 2, 3 }, { n = 1, policy = POLICY, set = { budget = 8 } }) end)
  if ok or not tostring(e):find("policy full: unknown parameter 'budget'", 1, true) then
    fail("set budget on full: %s", tostring(e))
  end
  print("  an unknown parameter is a clear error")
end
