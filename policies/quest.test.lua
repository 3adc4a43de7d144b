-- quest.test.lua — tests of policies/quest.lua (run by tests/test_policies.c from the repository
-- root, or `kvsieve run policies/quest.test.lua`).
--   1. a hand-computed page selection: the policy's decode handler on a made-up event of 9 rows
--      (pages of 2, one KV head, two query heads), with the bounds worked out below, for
--      gqa = "max" and "sum"; a dense layer and a budget that covers every page attend to all;
--   2. budget >= prompt + generated tokens: the generated ids equal full attention's;
--   3. on kvsieve-tiny, every selection of every layer and decode step equals a plain-Lua
--      reference of the method (min / max boxes, the bound, the group max or sum, top-k with
--      ties to the lower page) computed from the same event's q and keys; per-head lists differ;
--      With summaries = "box" (packed bf16 boxes, rounded outward from the CPU's f32 keys) the
--      reference rounds its min / max the same way (a set of its own);
--   4. "keep" (summaries extended page by page), "recompute" and the emulated device give the
--      same selections and ids;
--   5. bad parameters are refused with a message.
package.path = "tests/lua/?.lua;" .. package.path
local ks = require "kvsieve"
local polfix = require "polfix"
local fail = polfix.fail

local POLICY = "policies/quest.lua"

-- ---------------------------------------------------------------- 1. hand-computed selection
-- Keys (d = 2, one KV head), pages of 2 rows; page 4 (row 8) is the current page:
--   page 0: (1, 0)   (0, 2.5)   lo (0, 0)    hi (1, 2.5)
--   page 1: (-1, -1) (-2, 0)    lo (-2, -1)  hi (-1, 0)
--   page 2: (3, 1)   (2, -1)    lo (2, -1)   hi (3, 1)
--   page 3: (-3, 4)  (-4, 2)    lo (-4, 2)   hi (-3, 4)
--   page 4: (5, 5)
-- Query heads q0 = (1, 0), q1 = (0, 1); bound = sum_i max(q_i lo_i, q_i hi_i):
--   q0: page 0: 1    page 1: -1   page 2: 3   page 3: -3
--   q1: page 0: 2.5  page 1: 0    page 2: 1   page 3: 4
--   max: 2.5, 0, 3, 4  -> top 2: pages 2, 3 -> rows 4 5 6 7, then the current page's row 8
--   sum: 3.5, -1, 4, 1 -> top 2: pages 0, 2 -> rows 0 1 4 5, then 8
-- budget 6 = 3 pages: the current page and 2 candidates.
do
  local pol = dofile(POLICY)
  local keys = ks.tensor({ { { 1, 0 } }, { { 0, 2.5 } }, { { -1, -1 } }, { { -2, 0 } }, { { 3, 1 } }, { { 2, -1 } },
                           { { -3, 4 } }, { { -4, 2 } }, { { 5, 5 } } }, "f32")
  local function event(layer)
    local ev = { layer = layer, kv_rows = { 9 }, n_kv_heads = 1, head_dim = 2,
                 q = ks.tensor({ { { 1, 0 }, { 0, 1 } } }, "f32"), reports = {} }
    function ev:kv_keys() return keys end
    function ev:attend(rows, o) -- the whole list, as the engine reads it: rows ++ the after range
      local t = rows:tolist()
      local per = type(t[1]) == "table" and t or { t }
      for _, list in ipairs(per) do
        for r = (o and o.after or { 0, 0 })[1], (o and o.after or { 0, 0 })[2] - 1 do list[#list + 1] = r end
      end
      self.attended = type(t[1]) == "table" and per or per[1]
    end
    function ev:replay() end
    function ev:report(k, v) self.reports[k] = v end
    return ev
  end
  local function run(set, layer)
    local p = {}
    for k, v in pairs(pol.params) do p[k] = v end
    for k, v in pairs(set) do p[k] = v end
    pol.begin(p)
    local ev = event(layer or 2)
    pol.decode_qkv(ev, p)
    return ev
  end
  local function rows_of(ev) -- the one KV head's list (a per-head (1, w) tensor, or one shared list)
    if not ev.attended then return "none" end
    return table.concat(type(ev.attended[1]) == "table" and ev.attended[1] or ev.attended, ",")
  end
  local ev = run({ budget = 6, page = 2, trace = true })
  if rows_of(ev) ~= "4,5,6,7,8" or ev.reports["d0.l2"] ~= "2,3" then
    fail("hand case, gqa max: attended %s (pages %s), expected 4,5,6,7,8 (pages 2,3)", rows_of(ev), tostring(ev.reports["d0.l2"]))
  end
  ev = run({ budget = 7, page = 2, gqa = "sum", trace = true, summaries = "recompute" }) -- 7 // 2 = 3 pages too
  if rows_of(ev) ~= "0,1,4,5,8" or ev.reports["d0.l2"] ~= "0,2" then
    fail("hand case, gqa sum: attended %s (pages %s), expected 0,1,4,5,8 (pages 0,2)", rows_of(ev), tostring(ev.reports["d0.l2"]))
  end
  ev = run({ budget = 6, page = 2, trace = true, summaries = "box" }) -- these keys are bf16 values: the same bounds
  if rows_of(ev) ~= "4,5,6,7,8" or ev.reports["d0.l2"] ~= "2,3" then
    fail("hand case, packed boxes: attended %s (pages %s), expected 4,5,6,7,8 (pages 2,3)", rows_of(ev), tostring(ev.reports["d0.l2"]))
  end
  ev = run({ budget = 2, page = 2 })
  if rows_of(ev) ~= "8" then fail("hand case, budget of one page: attended %s, expected 8", rows_of(ev)) end
  ev = run({ budget = 6, page = 2 }, 1)
  if ev.attended then fail("hand case: layer 1 < dense_layers attended %s", rows_of(ev)) end
  ev = run({ budget = 10, page = 2 })
  if ev.attended or ev.reports.dense_steps ~= 1 then fail("hand case: a budget of every page attended %s", rows_of(ev)) end
  print("quest: hand-computed page selections (gqa max and sum, one page, dense layer, full budget)")
end

-- ---------------------------------------------------------------- the tiny model
if not polfix.has_model("models/kvsieve-tiny") then polfix.skip("models/kvsieve-tiny is not readable") end
local m = ks.load("models/kvsieve-tiny", { threads = 1 }) -- tiny model: threads only add overhead
local s = m:session()
local prompt = {}
for i = 1, 300 do prompt[i] = 3 + (i * 7919) % 500 end
local N_GEN = 8

-- 2. budget >= prompt: full attention's ids
do
  local full = s:generate(prompt, { n = N_GEN })
  local r = s:generate(prompt, { n = N_GEN, policy = POLICY, set = { budget = #prompt + N_GEN, page = 16, dense_layers = 0 } })
  polfix.eq_list(r.ids, full.ids, "quest with budget >= prompt + generated vs full")
  if r.report.selections ~= nil or r.report.dense_steps ~= (N_GEN - 1) * m.config.n_layers then
    fail("budget >= prompt: selections %s, dense_steps %s (expected none and %d)", tostring(r.report.selections),
         tostring(r.report.dense_steps), (N_GEN - 1) * m.config.n_layers)
  end
  print("quest: budget >= prompt gives full attention's ids")
end

-- 3. every selection against a plain-Lua reference
local function f32(x) return (string.unpack("f", string.pack("f", x))) end
-- x (an f32 value) rounded to bf16 toward -inf (down) or +inf: the nearest bf16 on that side
local function bf16_dir(x, down)
  local u = string.unpack("<I4", string.pack("<f", x))
  local t = u & 0xffff0000
  if t == u or x ~= x or x == math.huge or x == -math.huge then return x end
  local neg = u >> 31 == 1
  if down == neg then t = t + 0x10000 end -- one bf16 step away from zero
  return (string.unpack("<f", string.pack("<I4", t)))
end

-- pages chosen per KV head for q (1, H, d) and keys (N, Hkv, d) as Lua tables: "1,4|0,3"
local function reference(q, keys, N, P, K, gqa, box)
  local last = (N - 1) // P
  local H, Hkv, d = #q[1], #keys[1], #keys[1][1]
  local g = H // Hkv
  local heads = {}
  for kv = 1, Hkv do
    local score = {}
    for pg = 0, last - 1 do
      local lo, hi = {}, {}
      for i = 1, d do lo[i], hi[i] = math.huge, -math.huge end
      for r = pg * P + 1, pg * P + P do
        local k = keys[r][kv]
        for i = 1, d do
          if k[i] < lo[i] then lo[i] = k[i] end
          if k[i] > hi[i] then hi[i] = k[i] end
        end
      end
      if box then
        for i = 1, d do lo[i], hi[i] = bf16_dir(lo[i], true), bf16_dir(hi[i], false) end
      end
      local best, sum
      for t = 1, g do
        local qh = q[1][(kv - 1) * g + t]
        local acc = 0.0
        for i = 1, d do
          local a, b = qh[i] * lo[i], qh[i] * hi[i]  -- exact in double, as the primitive's
          acc = acc + (a > b and a or b)
        end
        local v = f32(acc)
        if best == nil or v > best then best = v end
        sum = (sum or 0.0) + acc
      end
      score[#score + 1] = { page = pg, v = gqa == "max" and best or f32(sum) }
    end
    table.sort(score, function(a, b) if a.v ~= b.v then return a.v > b.v end return a.page < b.page end)
    local chosen = {}
    for i = 1, K - 1 do chosen[i] = score[i].page end
    table.sort(chosen)
    heads[kv] = table.concat(chosen, ",")
  end
  return table.concat(heads, "|")
end

local function checked_run(set)
  local pol = dofile(POLICY)
  local expected, n_sel, calls = {}, 0, {}
  local wrapped = {
    params = pol.params,
    begin = pol.begin,
    decode_qkv = function(ev, p)
      local N = ev.kv_rows[1]
      local last, K = (N - 1) // p.page, p.budget // p.page
      local step = calls[ev.layer] or 0  -- the policy's own step count: every decode step of the layer
      calls[ev.layer] = step + 1
      if ev.layer >= p.dense_layers and p.budget < N and K - 1 < last and K > 1 then
        expected["d" .. step .. ".l" .. ev.layer] = reference(ev.q:tolist(), ev:kv_keys():tolist(), N, p.page, K, p.gqa,
                                                              p.summaries == "box")
        n_sel = n_sel + 1
      end
      return pol.decode_qkv(ev, p)
    end,
  }
  local r = s:generate(prompt, { n = N_GEN, policy = wrapped, set = set })
  if n_sel == 0 then fail("no selection was made (budget %d, page %d)", set.budget, set.page) end
  local differ = false
  for key, want in pairs(expected) do
    local got = r.report[key]
    if got ~= want then fail("%s: selected pages %s, the reference %s", key, tostring(got), want) end
    local a, b = want:match("^([^|]*)|([^|]*)$")
    if a and a ~= b then differ = true end
  end
  if r.report.selections ~= n_sel then fail("%d selections reported, %d expected", r.report.selections or 0, n_sel) end
  return r, n_sel, differ
end

local sets = {
  { budget = 64, page = 8, trace = true },
  { budget = 64, page = 16, trace = true, gqa = "sum", dense_layers = 0, summaries = "recompute" },
  { budget = 40, page = 5, trace = true, dense_layers = 3 },
  { budget = 64, page = 8, trace = true, summaries = "box" },
}
local runs = {}
for i, set in ipairs(sets) do
  local r, n_sel, differ = checked_run(set)
  if not differ then fail("set %d: the two KV heads chose the same pages at every step (per-head lists untested)", i) end
  runs[i] = r
  print(string.format("quest: %d selections equal the plain-Lua reference (budget %d, page %d, gqa %s, summaries %s)", n_sel,
                      set.budget, set.page, set.gqa or "max", set.summaries or "auto"))
end

-- 4. keep / recompute / emulated device: the same choices and ids
do
  local base = { budget = 64, page = 8, trace = true }
  local function with(extra)
    local t = {}
    for k, v in pairs(base) do t[k] = v end
    for k, v in pairs(extra) do t[k] = v end
    return s:generate(prompt, { n = N_GEN, policy = POLICY, set = t })
  end
  local variants = { keep = with({ summaries = "keep" }), recompute = with({ summaries = "recompute" }),
                     emulate = with({ _device = "emulate" }) }
  for name, r in pairs(variants) do
    polfix.eq_list(r.ids, runs[1].ids, "quest " .. name .. " vs the checked run")
    for k, v in pairs(runs[1].report) do
      if r.report[k] ~= v then fail("quest %s: report %s = %s, the checked run %s", name, k, tostring(r.report[k]), tostring(v)) end
    end
  end
  -- packed boxes on the emulated device: the host's box run (set 4)
  local eb = with({ _device = "emulate", summaries = "box" })
  polfix.eq_list(eb.ids, runs[4].ids, "quest box, emulated vs host")
  for k, v in pairs(runs[4].report) do
    if eb.report[k] ~= v then fail("quest box emulated: report %s = %s, the host %s", k, tostring(eb.report[k]), tostring(v)) end
  end
  print("quest: keep, recompute and the emulated device choose the same pages (boxes: emulated = host)")
end

-- 5. parameters
do
  local bad = polfix.bad_params(s, POLICY)
  bad({ page = 0 }, "page (0) must be >= 1")
  bad({ budget = 8, page = 16 }, "budget (8) must be at least one page (16)")
  bad({ dense_layers = -1 }, "dense_layers (-1) must be >= 0")
  bad({ gqa = "mean" }, "gqa must be \"max\" or \"sum\"")
  bad({ summaries = "sometimes" }, "summaries must be \"auto\", \"box\", \"keep\" or \"recompute\"")
  print("quest: bad parameters are refused")
end
