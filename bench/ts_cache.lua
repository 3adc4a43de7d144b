-- ts_cache.lua — TokenSelect's selection cache on the bundled model's real decode: for each
-- cache_theta, the hit rate (hits / decisions, from the policy's reports) and the decode speed of
-- one greedy generation, the decisions made where the tensors are (the default) and, with
-- "traced", read and compared in Lua at each layer (trace = true: the cosine goes to the host).
--   build-cuda/kvsieve run bench/ts_cache.lua [cpu|cuda] [traced]
local ks = require "kvsieve"
local backend = arg[1] or "cuda"
local traced = arg[2] == "traced"
local m = ks.load("models/kvsieve-tiny", { backend = backend })
local filler = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
local prompt = "A long story begins. " .. string.rep(filler, 120) .. "The end is near, and"
print(string.format("%-6s %-7s %7s %6s %6s %8s %9s %9s", "theta", "traced", "prompt", "gen", "hits", "misses", "hit rate", "TPOT ms"))
for _, theta in ipairs({ 0, 0.95, 0.9, 0.8, 0.5 }) do
  local s = m:session()
  local r = s:generate(prompt, { n = 64, policy = "tokenselect",
    set = { n_init = 32, k = 256, n_local = 256, cache_theta = theta, trace = traced } })
  local h, mi = tonumber(r.report.cache_hits) or 0, tonumber(r.report.cache_misses) or 0
  print(string.format("%-6g %-7s %7d %6d %6d %8d %9s %9.3f", theta, tostring(traced), r.prompt_tokens, r.n_generated, h, mi,
    h + mi > 0 and string.format("%.3f", h / (h + mi)) or "-", 1000 * r.decode_s / math.max(1, r.n_generated - 1)))
end
