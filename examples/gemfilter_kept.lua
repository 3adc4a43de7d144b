-- gemfilter_kept.lua — which prompt tokens GemFilter keeps on the bundled model, per filter layer (the
-- model was fine-tuned so that layer 2 selects the needle: models/kvsieve-tiny/README.md):
-- build/kvsieve run examples/gemfilter_kept.lua
local ks = require "kvsieve"
local m = ks.load("models/kvsieve-tiny")
local s = m:session()
local filler = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
local half = {}
for i = 1, 40 do half[#half + 1] = filler end
local prompt = "There is a pass key hidden in the following text. Find it and remember it; you will be asked for it at the end.\n"
  .. table.concat(half, " ") .. " The pass key is 68219. Remember it. 68219 is the pass key. " .. table.concat(half, " ")
  .. "\nWhat is the pass key? The pass key is"
for _, L in ipairs({1, 2, 3, 5}) do
  local r = s:generate(prompt, {n = 6, policy = "gemfilter", set = {layer = L, k = 128}})
  local idx = r.restart
  local kept = m:decode((function() local ids = m:encode(prompt, {special = true}); local t = {} for _, i in ipairs(idx) do t[#t+1] = ids[i+1] end return t end)())
  print(("layer %d -> %q"):format(L, r.text))
  print("  kept text: " .. kept:gsub("\n", " "):sub(1, 400))
end
