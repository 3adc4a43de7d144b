-- noop.test.lua — the do-nothing policy generates exactly what no policy generates
-- (stories260K from $KS_SHARED, default ../shared; skipped when absent).
package.path = "tests/lua/?.lua;" .. package.path
local ks = require "kvsieve"
local polfix = require "polfix"
local dir = polfix.STORIES
if not polfix.has_model(dir) then polfix.skip("noop: " .. dir .. " absent") end
local m = ks.load(dir, {threads = 1})
local s = m:session()
local a = s:generate("Once upon a time there was a little girl", {n = 24})
local b = s:generate("Once upon a time there was a little girl", {n = 24, policy = "noop"})
assert(#a.ids == 24, ("%d tokens, expected 24"):format(#a.ids))
assert(#a.ids == #b.ids, "different lengths")
for i = 1, #a.ids do assert(a.ids[i] == b.ids[i], ("token %d: %d vs %d"):format(i, a.ids[i], b.ids[i])) end
print(("noop: %d tokens identical to no policy"):format(#a.ids))
