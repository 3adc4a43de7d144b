-- ts_vote_bits.lua — TokenSelect's head votes and selections on the bundled model, every report
-- printed in a fixed order (numbers with Lua's 14 significant digits, so float32 values print
-- exactly): run it with two builds and diff the outputs to show that a change of the selection
-- kernels kept their bits.
--   build-cuda/kvsieve run bench/ts_vote_bits.lua [cpu|cuda]
local ks = require "kvsieve"
local backend = arg[1] or "cuda"
local m = ks.load("models/kvsieve-tiny", { backend = backend })
local s = m:session()
local filler = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
local prompt = "A long story begins. " .. string.rep(filler, 60) .. "The end is near, and"
local r = s:generate(prompt, { n = 8, policy = "tokenselect",
  set = { n_init = 32, k = 256, n_local = 256, trace = true, trace_scores = "p1,p2,d0,d1,d3,d7" } })
local keys = {}
for k in pairs(r.report) do keys[#keys + 1] = k end
table.sort(keys)
print("text: " .. r.text)
for _, k in ipairs(keys) do print(k .. " = " .. tostring(r.report[k])) end
