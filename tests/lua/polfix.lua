-- polfix.lua — helpers shared by the policy tests (policies/*.test.lua) that check a policy
-- against the reference fixtures of tests/fixtures/policies (tools/policy_ref.py; the fields
-- are described in tools/README.md). `local polfix = require "polfix"` from the repository
-- root (tests/test_policies.c puts tests/lua/ on package.path).
--   skips:     skip(reason), skip_part(reason)
--   fixtures:  ROOT, SHARED, STORIES, manifest(), model_dir(name), cases_of(policy), shortest_case
--   models:    readable(path), has_model(dir), model(name), session(name), fixture_cases(cases)
--   parameters: bad_params(s, policy, prompt)
--   lists:     range, below, split, union, fmt_list, split_ints
--   checks:    fail, eq_list, check_ids, expect_error, rel_err, set_diff, check_topk, cmp_set
local ks = require "kvsieve"
local json = require "json"

local polfix = {}
local fmt = string.format
polfix.fmt = fmt

polfix.ROOT = "tests/fixtures/policies/"
-- ../shared as seen from the repository root; env KS_SHARED overrides (as kt_shared_dir in C)
local env_shared = os.getenv("KS_SHARED")
polfix.SHARED = (env_shared and env_shared ~= "") and env_shared or "../shared"
polfix.STORIES = polfix.SHARED .. "/models/stories260K" -- the shared copy (absent: its cases are skipped)
polfix.MARGIN = 1e-3 -- compare generated ids while the reference's top1 - top2 logit gap exceeds this

-- ---------------------------------------------------------------- skips
-- tests/test_policies.c counts a script as skipped, not passed, when it raises polfix.skip
-- (nothing could run) or when it ran to the end after polfix.skip_part (a part could not run:
-- the reasons are gathered in the global KS_TEST_SKIPS, which the runner reads). Under
-- `kvsieve run`, polfix.skip ends the script with "skipped: REASON".
local skip_mt = { __tostring = function(e) return "skipped: " .. e.ks_skip end }
function polfix.skip(reason) error(setmetatable({ ks_skip = tostring(reason) }, skip_mt), 0) end

function polfix.skip_part(reason)
  reason = tostring(reason)
  local t = rawget(_G, "KS_TEST_SKIPS")
  if type(t) ~= "table" then t = {}; rawset(_G, "KS_TEST_SKIPS", t) end
  for _, r in ipairs(t) do if r == reason then return end end -- said once
  t[#t + 1] = reason
  print("  skipped: " .. reason)
end

-- error(fmt(f, ...)) blamed on the caller of polfix.fail (a test line)
function polfix.fail(f, ...) error(fmt(f, ...), 2) end
-- the same from inside a polfix check: blamed on the test line that called the check
local function fail3(f, ...) error(fmt(f, ...), 3) end

-- ---------------------------------------------------------------- fixtures and models
local manifest
function polfix.manifest()
  manifest = manifest or json.read(polfix.ROOT .. "manifest.json")
  return manifest
end

function polfix.model_dir(name)
  if name == "stories260K" then return polfix.STORIES end
  return polfix.ROOT .. polfix.manifest().models[name].dir
end

-- the manifest's entries for one policy; an error if it has none
function polfix.cases_of(policy)
  local cases = {}
  for _, c in ipairs(polfix.manifest().cases) do
    if c.policy == policy then cases[#cases + 1] = c end
  end
  if #cases == 0 then error("no " .. policy .. " cases in the fixture manifest", 2) end
  return cases
end

function polfix.readable(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

function polfix.has_model(dir)
  return polfix.readable(dir .. "/config.json") or polfix.readable(dir .. "/model.safetensors")
    or polfix.readable(dir .. "/model.bin")
end

-- One loaded model per fixture model name: { m = model, s = session }, or false when its folder
-- is absent (said once). One thread: the fastest for these tiny models on a busy machine.
local models = {}
function polfix.model(name)
  if models[name] == nil then
    local dir = polfix.model_dir(name)
    if not polfix.has_model(dir) then
      polfix.skip_part(fmt("%s: model folder %s is absent (its cases not run)", name, dir))
      models[name] = false
    else
      local m = ks.load(dir, { threads = 1 })
      models[name] = { m = m, s = m:session() }
    end
  end
  return models[name]
end

function polfix.session(name)
  local M = polfix.model(name)
  return M and M.s
end

-- the case (decoded) with the shortest prompt among `cases` (manifest entries) whose model is
-- available, or nil
function polfix.shortest_case(cases)
  local case
  for _, c in ipairs(cases) do
    if polfix.session(c.model) then
      local cc = json.read(polfix.ROOT .. c.file)
      if not case or cc.n_prompt < case.n_prompt then case = cc end
    end
  end
  return case
end

-- for case, s in polfix.fixture_cases(cases): each manifest entry of `cases`, decoded, with
-- the session of its model; the cases of an absent model are skipped (said once per model)
function polfix.fixture_cases(cases)
  return coroutine.wrap(function()
    for _, entry in ipairs(cases) do
      local s = polfix.session(entry.model)
      if s then coroutine.yield(json.read(polfix.ROOT .. entry.file), s) end
    end
  end)
end

-- bad(set, pattern): generating one token of `prompt` (default 1..39) with `policy` and the
-- parameters `set` must fail with an error containing `pattern`
function polfix.bad_params(s, policy, prompt)
  prompt = prompt or polfix.range(1, 40)
  return function(set, pattern)
    polfix.expect_error(pattern, function() return s:generate(prompt, { n = 1, policy = policy, set = set }) end)
  end
end

-- ---------------------------------------------------------------- lists
function polfix.range(a, b) local t = {} for i = a, b - 1 do t[#t + 1] = i end return t end

-- the prompt positions (< n) of a kept list, decode rows dropped
function polfix.below(list, n)
  local out = {}
  for _, p in ipairs(list) do if p < n then out[#out + 1] = p end end
  return out
end

-- split a kept list at `n`: positions below, and from n on
function polfix.split(list, n)
  local a, b = {}, {}
  for _, x in ipairs(list) do if x < n then a[#a + 1] = x else b[#b + 1] = x end end
  return a, b
end

function polfix.union(lists)
  local set, out = {}, {}
  for _, l in ipairs(lists) do for _, x in ipairs(l) do if not set[x] then set[x] = true; out[#out + 1] = x end end end
  table.sort(out)
  return out
end

function polfix.fmt_list(t, max)
  max = max or 12
  local out = {}
  for i = 1, math.min(#t, max) do out[i] = tostring(t[i]) end
  if #t > max then out[#out + 1] = "..." end
  return "{" .. table.concat(out, ",") .. "}"
end

-- the integers of a report string ("3,17,-1" -> { 3, 17, -1 })
function polfix.split_ints(s)
  local t = {}
  for x in tostring(s):gmatch("%-?%d+") do t[#t + 1] = math.tointeger(tonumber(x)) end
  return t
end

-- ---------------------------------------------------------------- checks
function polfix.eq_list(got, want, what)
  if #got ~= #want then fail3("%s: %d entries, expected %d", what, #got, #want) end
  for i = 1, #want do
    if got[i] ~= want[i] then fail3("%s: entry %d is %s, expected %s", what, i, tostring(got[i]), tostring(want[i])) end
  end
end

-- The generated ids against the fixture's, while its step margin is > MARGIN (and at most
-- `limit`, when given). Returns how many were compared.
function polfix.check_ids(got, case, what, limit)
  local n = 0
  for i, want in ipairs(case.generated_ids) do
    if case.step_margins[i] <= polfix.MARGIN or (limit and n >= limit) then break end
    if got[i] ~= want then
      fail3("%s: generated id %d is %s, expected %d (ids %s vs %s)", what, i, tostring(got[i]), want,
        table.concat(got, ","), table.concat(case.generated_ids, ","))
    end
    n = n + 1
  end
  return n
end

-- f(...) must raise an error whose text contains `pattern` (plain)
function polfix.expect_error(pattern, f, ...)
  local ok, e = pcall(f, ...)
  if ok then fail3("expected an error matching '%s'", pattern) end
  if not tostring(e):find(pattern, 1, true) then fail3("error '%s' lacks '%s'", tostring(e), pattern) end
end

-- max |got - want| / max |want|: the error relative to the vector's scale. (Per entry it
-- would not do: a raw score is a sum over heads of dot products, and an entry that cancels
-- to ~0.2 on a scale of ~27 carries the same ~5e-5 absolute difference as the large ones,
-- which come from the engine's hidden states differing from HF's by ~1e-6 relative.)
function polfix.rel_err(got, want)
  if #got ~= #want then fail3("score vectors of %d and %d entries", #got, #want) end
  local scale, worst = 0, 0
  for i, w in ipairs(want) do
    scale = math.max(scale, math.abs(w))
    worst = math.max(worst, math.abs(got[i] - w))
  end
  return worst / scale
end

-- the entries of `want` missing from `got`, and those of `got` not in `want` (list order)
function polfix.set_diff(got, want)
  local gs, ws = {}, {}
  for _, x in ipairs(got) do gs[x] = true end
  for _, x in ipairs(want) do ws[x] = true end
  local missing, extra = {}, {}
  for _, x in ipairs(want) do if not gs[x] then missing[#missing + 1] = x end end
  for _, x in ipairs(got) do if not ws[x] then extra[#extra + 1] = x end end
  return missing, extra
end

-- A top-k set against the reference's, with its boundary object `bnd` (tools/README.md):
-- every candidate above the k-th value must be taken; of an exact tie group exactly the
-- lowest `tie_taken`; a near tie (bnd.near_tie) may swap the boundary entries. `value`
-- (optional) gives a position's reference score, to check that a swap really is at the
-- boundary. Returns "exact" or "near-tie swap".
function polfix.check_topk(got, want, bnd, what, value)
  local missing, extra = polfix.set_diff(got, want)
  if #got ~= #want then fail3("%s: %d selected, expected %d", what, #got, #want) end
  if #missing == 0 then return "exact" end
  local msg = fmt("%s: %d positions differ (missing %s; extra %s)", what, #missing,
    table.concat(missing, ",", 1, math.min(#missing, 8)), table.concat(extra, ",", 1, math.min(#extra, 8)))
  if not bnd or bnd == json.null then fail3("%s; every candidate should be taken", msg) end
  if bnd.exact_tie then fail3("%s; exact tie at %.9g: the lower indices must win", msg, bnd.kth) end
  if not bnd.near_tie then fail3("%s; no tie at the boundary (rel_gap %.3g)", msg, bnd.rel_gap) end
  if value then
    local tol = 1e-5 * math.max(math.abs(bnd.kth), math.abs(bnd.next))
    for _, x in ipairs(missing) do
      if math.abs(value(x) - bnd.kth) > tol then fail3("%s; missing %d is not at the boundary", msg, x) end
    end
    for _, x in ipairs(extra) do
      if math.abs(value(x) - bnd.next) > tol and math.abs(value(x) - bnd.kth) > tol then
        fail3("%s; extra %d is not at the boundary", msg, x)
      end
    end
  end
  return "near-tie swap"
end

-- A looser set comparison (asl, fastkv): "exact", or "near" — the same size, a boundary that
-- is not an exact tie but a near one (bnd.near_tie, or |rel_gap| <= near_rel, default 1e-4:
-- may come out swapped in float32), and at most two positions swapped (printed as a note);
-- anything else raises, describing the boundary.
function polfix.cmp_set(what, ours, ref, bnd, near_rel)
  local missing, extra = polfix.set_diff(ours, ref)
  if #extra == 0 and #missing == 0 and #ours == #ref then return "exact" end
  local b = bnd ~= json.null and bnd or nil
  local desc = b and fmt(" (boundary: k %d of %d, kth %s, next %s, rel_gap %s, exact_tie %s)", b.k, b.n_cand,
    tostring(b.kth), tostring(b.next), tostring(b.rel_gap), tostring(b.exact_tie)) or " (no boundary in the fixture)"
  if #ours == #ref and b and not b.exact_tie and (b.near_tie or math.abs(b.rel_gap) <= (near_rel or 1e-4)) and #extra <= 2 then
    print(fmt("    note: %s swaps %s for %s across a near tie%s", what, polfix.fmt_list(missing), polfix.fmt_list(extra), desc))
    return "near"
  end
  fail3("%s: %d positions vs the reference's %d; we have %s that it lacks, it has %s that we lack%s",
    what, #ours, #ref, polfix.fmt_list(extra), polfix.fmt_list(missing), desc)
end

-- a short description of an exact tie at the boundary ("" when none)
function polfix.tie_note(bnd)
  if bnd ~= nil and bnd ~= json.null and bnd.exact_tie then
    return fmt(" (exact tie: %d of %d taken)", bnd.tie_taken, #bnd.tie_group)
  end
  return ""
end

return polfix
