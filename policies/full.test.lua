-- full.test.lua — policies/full.lua: the baseline. Run from the repository root:
-- `kvsieve run policies/full.test.lua` (or the policy_lua_tests test).
--   1. it defines no handler (so it costs nothing) and no parameter;
--   2. for every model of the reference fixtures (tests/fixtures/policies, tools/policy_ref.py):
--      the same tokens as the engine with no policy, and the fixture's full generated_ids
--      (compared while the reference's step margin is > 1e-3); every row kept;
--   3. a parameter it does not have is a clear error naming it.
package.path = "tests/lua/?.lua;" .. package.path
local ks = require "kvsieve"
local json = require "json"

local POLICY = "full"
local ROOT = "tests/fixtures/policies/"
local manifest = json.read(ROOT .. "manifest.json")
local fmt = string.format

local function fail(f, ...) error(fmt(f, ...), 2) end

local function model_dir(name)
  if name == "stories260K" then return "../shared/models/stories260K" end
  return ROOT .. manifest.models[name].dir
end

local function readable(path)
  local f = io.open(path)
  if f then f:close() return true end
  return false
end

local function range(a, b) local t = {} for i = a, b - 1 do t[#t + 1] = i end return t end

local function eq_list(got, want, what)
  if #got ~= #want then fail("%s: %d entries, expected %d", what, #got, #want) end
  for i = 1, #want do
    if got[i] ~= want[i] then fail("%s: entry %d is %s, expected %s", what, i, tostring(got[i]), tostring(want[i])) end
  end
end

local function check_ids(got, case, what)
  local n = 0
  for i, want in ipairs(case.generated_ids) do
    if case.step_margins[i] <= 1e-3 then break end
    if got[i] ~= want then
      fail("%s: generated id %d is %s, expected %d (ids %s vs %s)", what, i, tostring(got[i]), want,
        table.concat(got, ","), table.concat(case.generated_ids, ","))
    end
    n = n + 1
  end
  return n
end

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
for _, entry in ipairs(manifest.cases) do
  if entry.policy == POLICY then
    n_cases = n_cases + 1
    local case = json.read(ROOT .. entry.file)
    local name, n = case.model.name, case.n_prompt
    local dir = model_dir(name)
    if not readable(dir .. "/model.safetensors") then
      print(fmt("  %-24s skipped: model folder %s is absent", case.case, dir))
    else
      local m = ks.load(dir, { threads = 1 })
      local s = m:session()
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
