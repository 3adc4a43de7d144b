-- noop.test.lua — the do-nothing policy generates exactly what no policy generates.
local ks = require "kvsieve"
local dir = "../shared/models/stories260K"
local f = io.open(dir .. "/config.json")
if not f then print("noop: " .. dir .. " absent, skipped") return end
f:close()
local m = ks.load(dir, {threads = 1})
local s = m:session()
local a = s:generate("Once upon a time there was a little girl", {n = 24})
local b = s:generate("Once upon a time there was a little girl", {n = 24, policy = "noop"})
assert(#a.ids == #b.ids, "different lengths")
for i = 1, #a.ids do assert(a.ids[i] == b.ids[i], ("token %d: %d vs %d"):format(i, a.ids[i], b.ids[i])) end
print(("noop: %d tokens identical to no policy"):format(#a.ids))
