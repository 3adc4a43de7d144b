-- tokenselect_cache.lua — TokenSelect's selection cache on the bundled model's real decode (issue
-- 14): hit rate and decode speed for cache_theta = 0 (off), 0.9 (the paper's), 0.95 and -1 (every
-- step after a layer's first selection hits: the hit path's measurement mode). Prompts: ~2K-token
-- windows of six novels in ../shared/corpora (the model's context is 2K), n_init 16, k 256,
-- n_local 256, up to 128 tokens sampled at temperature 0.8 (seed 7; a request ends at EOS).
-- Run from the repository root: build/kvsieve run bench/tokenselect_cache.lua [CORPORA_DIR]
local ks = require "kvsieve"
local dir = arg and arg[1] or "../shared/corpora"
local books = {"emma.txt", "mobydick.txt", "persuasion.txt", "prideprejudice.txt", "mansfieldpark.txt", "northangerabbey.txt"}
local prompts = {}
for _, b in ipairs(books) do
  local f = assert(io.open(dir .. "/" .. b, "rb"))
  prompts[#prompts + 1] = f:read("a"):sub(20001, 27000)
  f:close()
end
local m = ks.load("models/kvsieve-tiny")
local s = m:session()
print(("%-6s %6s %6s %7s %9s %10s %s"):format("theta", "steps", "hits", "misses", "hit rate", "decode/s", "ids equal to off"))
local base = {}
for _, th in ipairs({0, 0.9, 0.95, -1}) do
  local steps, hits, misses, secs, same = 0, 0, 0, 0, 0
  for i, p in ipairs(prompts) do
    local r = s:generate(p, {n = 128, temp = 0.8, seed = 7, policy = "tokenselect",
                             set = {n_init = 16, k = 256, n_local = 256, cache_theta = th}})
    steps, secs = steps + r.n_generated, secs + r.decode_s
    hits = hits + tonumber(r.report.cache_hits or 0)
    misses = misses + tonumber(r.report.cache_misses or 0)
    if th == 0 then base[i] = r.ids end
    local eq = #base[i] == #r.ids
    for j = 1, math.min(#base[i], #r.ids) do if base[i][j] ~= r.ids[j] then eq = false end end
    if eq then same = same + 1 end
  end
  local rate = hits + misses > 0 and hits / (hits + misses) or 0
  print(("%-6s %6d %6d %7d %8.1f%% %10.1f %d/%d"):format(tostring(th), steps, hits, misses, 100 * rate,
                                                         steps / secs, same, #prompts))
end
