-- test_module.lua — the kvsieve module on a tiny random model (ids only, no tokenizer):
-- generate and its results, named / object / inline policies, parameters, every event and
-- action, streaming, and the errors of misuse. Run by tests/test_lua.c with the model
-- folder as its argument (or `kvsieve run tests/lua/test_module.lua DIR` from the repo root).
local ks = require "kvsieve"
local dir = ... or MODEL
assert(dir, "usage: test_module.lua MODEL_DIR")

local function expect_error(pattern, f, ...)
  local ok, e = pcall(f, ...)
  assert(not ok, "expected an error matching '" .. pattern .. "'")
  assert(tostring(e):find(pattern, 1, true), string.format("error '%s' lacks '%s'", tostring(e), pattern))
  return e
end

local function eq_list(a, b, what)
  assert(#a == #b, string.format("%s: length %d vs %d", what, #a, #b))
  for i = 1, #a do assert(a[i] == b[i], string.format("%s[%d]: %s vs %s", what, i, tostring(a[i]), tostring(b[i]))) end
end

local function range(a, b) local t = {} for i = a, b - 1 do t[#t + 1] = i end return t end

local m = ks.load(dir)
local cfg = m.config
assert(cfg.n_layers == 2 and cfg.n_heads == 4 and cfg.n_kv_heads == 2 and cfg.head_dim == 8 and cfg.arch == "llama")
assert(tostring(m):find("2 layers"))
assert(m.has_tokenizer == false)
expect_error("encode:", function() return m:encode("hello") end)
local s = m:session()
local prompt = { 1, 5, 9, 12, 3, 7, 22, 40, 17, 33, 8, 50 }
local N = #prompt

-- ---------------------------------------------------------------- full attention
local full = s:generate(prompt, { n = 6 })
assert(#full.ids == 6 and full.n_generated == 6 and full.prompt_tokens == N)
eq_list(full.prompt_ids, prompt, "prompt_ids")
assert(full.prefill_s >= 0 and full.decode_s >= 0 and full.tps >= 0)
assert(full.report and next(full.report) == nil and full.policy == nil and full.restart == nil)
for l = 0, cfg.n_layers - 1 do
  -- prompt + 5 decoded tokens resident (the 6th sampled token is never fed back)
  eq_list(full.kept(l, 0), range(0, N + 5), "full kept")
  eq_list(full:kept(l, 1), range(0, N + 5), "full kept head 1")
  assert(full.kv_rows[l + 1] == (N + 5) * cfg.n_kv_heads)
  assert(full.active_rows[l + 1] == N)
end
expect_error("kept: layer 2 out of range", function() return full.kept(2, 0) end)
expect_error("kept: KV head 5", function() return full.kept(0, 5) end)
assert(tostring(full):find("12 prompt + 6 generated", 1, true), tostring(full))
local again = s:generate(prompt, { n = 6 })
eq_list(again.ids, full.ids, "greedy is deterministic")
local sampled = s:generate(prompt, { n = 6, temp = 0.8, seed = 3 })
eq_list(s:generate(prompt, { n = 6, temp = 0.8, seed = 3 }).ids, sampled.ids, "seeded sampling")

-- ---------------------------------------------------------------- a named policy: every event
local r = s:generate(prompt, { n = 4, policy = "tests/policies/test_events.lua" })
local full4 = s:generate(prompt, { n = 4 })
eq_list(r.ids, full4.ids, "a policy that acts on nothing changes nothing")
local rep = r.report
assert(rep.begin == true, "begin ran")
assert(rep.prefill_qkv == cfg.n_layers and rep.prefill_layer_end == cfg.n_layers and rep.prefill_end == 1)
assert(rep.decode_qkv == cfg.n_layers * 3, "decode_qkv " .. tostring(rep.decode_qkv))
assert(rep.token == 4 and rep.last_token == r.ids[4] and rep.prefill_end_n == N)
assert(r.policy == "test_events")
-- reports are per request
local r2 = s:generate(prompt, { n = 1, policy = "tests/policies/test_events.lua" })
assert(r2.report.token == 1 and r2.report.decode_qkv == nil)
-- results stay valid after the next generate
eq_list(r.kept(1, 0), range(0, N + 3), "old result")

-- ---------------------------------------------------------------- parameters
local rp = s:generate(prompt, { n = 1, policy = "tests/policies/test_params.lua" })
assert(rp.report.k == 64 and rp.report.k_type == "integer" and rp.report.ratio == 0.5 and rp.report.ratio_type == "float")
assert(rp.report.on == true and rp.report.mode == "avg" and rp.report.list_len == 2)
rp = s:generate(prompt, { n = 1, policy = "tests/policies/test_params.lua", set = { k = 7, ratio = 1, on = false, mode = "max" } })
assert(rp.report.k == 7 and rp.report.ratio == 1.0 and rp.report.ratio_type == "float" and rp.report.on == false and rp.report.mode == "max")
local pol = ks.policy("tests/policies/test_params.lua", { k = 9 })
assert(pol.name == "test_params" and pol.params.k == 9 and pol.params.mode == "avg" and pol.params.list == "(table)")
rp = s:generate(prompt, { n = 1, policy = pol, set = { k = 11 } })
assert(rp.report.k == 11)
assert(pol.params.k == 9, "generate's set overrides are restored on a policy object")
assert(pol.report.k == 11, "the object keeps the last request's report")
pol:set("on", "no"):set({ mode = "x", ratio = 2 })
assert(pol:get("on") == false and pol:get("mode") == "x" and pol:get("ratio") == 2 and pol:get("k") == 9)
assert(pol:get("_memory_mb") == 64)
expect_error("unknown parameter 'kk' (parameters: k, list, mode, on, ratio", function() pol:set("kk", 1) end)
expect_error("parameter k expects an integer, got \"1.5\"", function() pol:set("k", 1.5) end)
expect_error("parameter on expects true or false", function() pol:set("on", "maybe") end)
expect_error("parameter list is a table", function() pol:set("list", "1") end)
expect_error("unknown parameter 'zz'", function() return s:generate(prompt, { n = 1, policy = pol, set = { zz = 1 } }) end)
assert(pol.params.k == 9, "a failed set leaves the object as it was")
expect_error("set needs a policy", function() return s:generate(prompt, { n = 1, set = { k = 1 } }) end)
expect_error("no policy named \"no_such_policy\"", function() return ks.policy("no_such_policy") end)
pol:close()
expect_error("policy used after it was closed", function() return pol.name end)

-- ---------------------------------------------------------------- actions (inline policies)
-- retain: shared and per head; the dropped rows are gone from the KV cache
r = s:generate(prompt, { n = 4, policy = { prefill_qkv = function(ev)
  if ev.layer == 1 then ev:retain({ 0, 2, 5, ev.n - 1 }) end
end } })
eq_list(r.kept(1, 0), { 0, 2, 5, 11, 12, 13, 14 }, "retain shared")
eq_list(r.kept(1), { 0, 2, 5, 11, 12, 13, 14 }, "retain: same on every head")
eq_list(r.kept(0, 1), range(0, N + 3), "other layers untouched")
assert(r.kv_rows[2] == 7 * 2 and r.kv_rows[1] == (N + 3) * 2)
r = s:generate(prompt, { n = 2, policy = { prefill_layer_end = function(ev)
  if ev.layer == 0 then ev:retain({ ks.tensor({ 1, 3 }), { 0, 4, 6 } }) end
end } })
eq_list(r.kept(0, 0), { 1, 3, 12 }, "retain head 0")
eq_list(r.kept(0, 1), { 0, 4, 6, 12 }, "retain head 1")
expect_error("heads of layer 0 hold different positions", function() return r.kept(0) end)
-- retain during decode
r = s:generate(prompt, { n = 4, policy = { decode_qkv = function(ev)
  local rows = ev.kv_rows[1]
  if ev.layer == 0 and rows > 4 then ev:retain({ 0, rows - 2, rows - 1 }) end
end } })
eq_list(r.kept(0, 0), { 0, 13, 14 }, "decode retain (a sliding window)")

-- propagate: later layers see only these rows, with their original positions
r = s:generate(prompt, { n = 3, policy = { prefill_layer_end = function(ev)
  if ev.layer == 0 then ev:propagate({ 0, 3, 4, 10, 11 }) end
end } })
eq_list(r.kept(1, 0), { 0, 3, 4, 10, 11, 12, 13 }, "propagate keeps original positions")
eq_list(r.kept(0, 0), range(0, N + 2), "the propagating layer keeps its rows")
assert(r.active_rows[1] == 5 and r.active_rows[2] == 5)
local seen_pos
r = s:generate(prompt, { n = 1, policy = {
  prefill_qkv = function(ev) if ev.layer == 0 then ev:propagate(ks.arange(6, 12)) else seen_pos = ev.pos:tolist() end end } })
eq_list(seen_pos, range(6, 12), "positions after propagate")

-- restart: a fresh prefill of the chosen tokens, positions 0..k-1; same as prompting them
local sub = { 0, 2, 3, 7, 11 }
local passes = {}
r = s:generate(prompt, { n = 5, policy = { prefill_qkv = function(ev)
  passes[#passes + 1] = ev.pass .. ":" .. ev.layer .. ":" .. ev.n
  if ev.layer == 1 and ev.pass == 0 then ev:restart(sub) end
end } })
local sub_ids = {}
for i, j in ipairs(sub) do sub_ids[i] = prompt[j + 1] end
local direct = s:generate(sub_ids, { n = 5 })
eq_list(r.ids, direct.ids, "restart == prompting the subset")
eq_list(r.restart, sub, "restart indices")
eq_list(r.kept(0, 0), range(0, #sub + 4), "renumbered positions")
eq_list(passes, { "0:0:12", "0:1:12", "1:0:5", "1:1:5" }, "passes")

-- stop: the forward pass ends at the layer
r = s:generate(prompt, { n = 1, policy = { prefill_qkv = function(ev) if ev.layer == 0 then ev:stop() end end } })
assert(r.stopped_at == 0 and #r.kept(1, 0) == 0 and #r.kept(0, 0) == N)

-- attend: all rows == full attention; renumbered or partial attention changes the output
r = s:generate(prompt, { n = 6, policy = { decode_qkv = function(ev)
  ev:attend(ks.arange(ev.kv_rows[1]))
end } })
eq_list(r.ids, full.ids, "attend to every row == full")
local attended = {}
r = s:generate(prompt, { n = 6, policy = { decode_qkv = function(ev)
  local n = ev.kv_rows[1]
  ev:attend({ 0, n - 1 }, { renumber = true })
  attended[#attended + 1] = n
end } })
eq_list(r.kept(1, 0), range(0, N + 5), "attend keeps every KV row")
assert(#attended == cfg.n_layers * 5)

-- invalid actions name the action and the event
local function bad(handlers, pattern)
  local e = expect_error(pattern, function() return s:generate(prompt, { n = 2, policy = handlers }) end)
  assert(e:find("policy inline:", 1, true), e)
end
bad({ prefill_qkv = function(ev) ev:retain({ 1, 1 }) end }, "duplicate index 1")
bad({ prefill_qkv = function(ev) ev:retain({ 0, 99 }) end }, "index 99 out of range [0, 12)")
bad({ prefill_layer_end = function(ev) ev:attend({ 0 }) end }, "attend is not allowed in event prefill_layer_end")
expect_error("restart is not allowed in a chunked prefill", function()
  return s:generate(prompt, { n = 2, policy = { prefill_chunk = 4, prefill_qkv = function(ev) ev:restart({ 0 }) end } })
end)
bad({ decode_qkv = function(ev) ev:restart({ 0 }) end }, "restart is not allowed in event decode_qkv")
bad({ token = function(ev) ev:stop() end }, "stop is not allowed in event token")
bad({ prefill_qkv = function(ev) ev:propagate({ 0 }); ev:propagate({ 1 }) end }, "propagate: asked twice")
bad({ prefill_qkv = function(ev) ev:retain({ { 0 }, { 1 }, { 2 } }) end }, "3 lists for 2 KV heads")
bad({ prefill_qkv = function(ev) ev:retain({}) end }, "empty index list")
bad({ prefill_qkv = function(ev) ev:retain(ks.tensor({ 0.5 })) end }, "indices must be integers")
bad({ prefill_qkv = function(ev) ev:retain({ 0.5 }) end }, "not an integer")
bad({ prefill_qkv = function(ev) return ev.hidden end }, "ev.hidden is not available in prefill_qkv")
bad({ prefill_qkv = function(ev) return ev.k_pre end }, "pre_rope_keys = true")
bad({ prefill_qkv = function(ev) return ev.nope end }, "no field or method 'nope'")
bad({ prefill_qkv = function(ev) ev.n = 3 end }, "read-only")
bad({ prefill_qkv = function(ev) return 1 end }, "invalid return value")
bad({ prefill_qkv = function(ev) if ev.pass == 0 then ev:restart({ 0 }) end end, prefill_end = function(ev) ev:report("x", {}) end }, "report: value must be")
expect_error("unknown handler 'prefil_qkv'", function() return s:generate(prompt, { policy = { prefil_qkv = function() end } }) end)
expect_error("unknown key 'nme'", function() return s:generate(prompt, { policy = { nme = "x" } }) end)

-- pre-RoPE mode (TokenSelect): the events' keys are unrotated, attention rotates them
r = s:generate(prompt, { n = 6, policy = { pre_rope_keys = true,
  prefill_qkv = function(ev)
    local a, b = ev.k_pre:row(3):tolist(), ev.k:row(3):tolist()
    assert(a[1][1] == b[1][1], "k_pre is k in pre-RoPE mode")
  end,
  decode_qkv = function(ev) assert(ev:kv_keys(1).shape[2] == 1 and #ev:kv_keys(1) == ev.kv_rows[2]) end } })
eq_list(r.ids, full.ids, "pre-RoPE attention == full attention")

-- chunked prefill: prefill_qkv per chunk, with the rows already in the layer
local chunks = {}
r = s:generate(prompt, { n = 6, policy = { prefill_chunk = 5,
  prefill_qkv = function(ev) if ev.layer == 1 then chunks[#chunks + 1] = ev.n .. "+" .. ev.kv_rows[1] .. "@" .. ev.pos:item(0) end end } })
eq_list(chunks, { "5+0@0", "5+5@5", "2+10@10" }, "chunks")
eq_list(r.ids, full.ids, "chunked prefill == full")
-- attend in a prefill chunk: indices cover the rows already there and this chunk's
r = s:generate(prompt, { n = 6, policy = { prefill_chunk = 4,
  prefill_qkv = function(ev) ev:attend(ks.arange(ev.kv_rows[1] + ev.n)) end } })
eq_list(r.ids, full.ids, "attend to everything in prefill chunks == full")
-- views die with their event (inline policies run unsandboxed, but views are still scoped)
local kept_view, kept_copy
r = s:generate(prompt, { n = 1, policy = { prefill_qkv = function(ev)
  kept_view = ev.q
  kept_copy = ev.q:clone()
end } })
expect_error("tensor view used after its event ended (it came from prefill_qkv, layer 1", function() return kept_view:tolist() end)
assert(kept_copy.shape[1] == N and not kept_copy.is_view)
assert(tostring(kept_view):find("stale view"))

-- ---------------------------------------------------------------- streaming
local pieces = 0
r = s:generate(prompt, { n = 5, stream = function(piece, id) pieces = pieces + 1; assert(type(piece) == "string" and math.type(id) == "integer") end })
assert(pieces == 5)
local stop_after = 0
r = s:generate(prompt, { n = 10, stream = function() stop_after = stop_after + 1; return stop_after == 3 end })
assert(#r.ids == 3, "returning true from stream stops")
expect_error("stream callback: ", function() return s:generate(prompt, { n = 3, stream = function() error("no thanks") end }) end)
expect_error("session is busy", function()
  return s:generate(prompt, { n = 2, stream = function() s:generate(prompt, { n = 1 }) end })
end)

-- ---------------------------------------------------------------- fallback
r = s:generate(prompt, { n = 6, fallback = true, policy = { prefill_qkv = function() error("broken") end } })
eq_list(r.ids, full.ids, "fallback answers with full attention")
assert(r.fallback and r.policy_error:find("broken"))

-- ---------------------------------------------------------------- misuse
expect_error("generate: unknown option 'max_tokens'", function() return s:generate(prompt, { max_tokens = 3 }) end)
expect_error("token id 100000 at index 0 out of range", function() return s:generate({ 100000 }) end)
expect_error("the prompt is empty", function() return s:generate({}) end)
local s2 = m:session()
m:close()
expect_error("model used after it was closed", function() return m.config end)
assert(#s2:generate(prompt, { n = 2 }).ids == 2, "sessions keep a closed model alive")
s2:close()
expect_error("session used after it was closed", function() return s2:generate(prompt) end)
s:close()
return "ok"
