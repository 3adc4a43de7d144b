-- fastkv_calibrate.lua — choose FastKV's TSP layer for a model (the paper's Eq. 3).
--
--   build/kvsieve run tools/fastkv_calibrate.lua MODEL_DIR [options] [prompt ...]
--
-- FastKV (policies/fastkv.lua) runs full context up to its TSP layer t and only the
-- propagated tokens after it. The paper picks t per model on calibration inputs:
--     L_TSP = argmin_{L <= L_max} (1/N) sum_i || H_i - H'_{L,i} ||^2            (Eq. 3)
-- H_i = the final-layer hidden state of calibration input i under full context, H'_{L,i} the
-- same with TSP at layer L, searching "the earliest layer whose output remains close to the
-- full-context baseline" with L <= L_max so that the prefill still saves compute.
--
-- What this program does: for every prompt, one full-context prefill and one FastKV prefill per
-- candidate t = t_min..L_max (the policy file itself, with tsp_layer = t and the other FastKV
-- parameters as given by --set), capturing the final layer's output at the LAST prompt row
-- (ev.hidden in the last layer's prefill_layer_end, before the final norm: the row that
-- produces the next token; earlier rows may not exist under TSP). Per t it prints the mean and
-- worst cosine similarity to full context, the mean relative squared distance
-- ||H - H'||^2 / ||H||^2 (Eq. 3's quantity, scale-free), how often the first generated token
-- agrees with full context, and how many prompts really propagated: the statistics cover only
-- those (a prompt too short for the layer's capacity runs full context there and says nothing). The choice: the earliest t whose
-- mean cosine is within --tol of the best mean cosine over t <= L_max (the earliest
-- near-argmin, as the paper describes it); Eq. 3's plain argmin is printed too.
--
-- How the final hidden state is captured: policies/fastkv.lua is loaded as a table (dofile,
-- unsandboxed here) and run as an inline policy whose prefill_layer_end copies that row;
-- FastKV's own handlers (begin, prefill_qkv) are used unchanged, with the same parameters.
--
-- Options
--   --lmax N        largest candidate layer (default: n_layers // 2, e.g. 16 of 32)
--   --tmin N        smallest candidate layer (default 0)
--   --tol X         cosine tolerance of the choice (default 0.01)
--   --len N         prompts are cut to their first N tokens; the length of generated prompts
--                   (default 2048; capped at the model's context)
--   --random C      use C prompts of uniform random token ids (models without a tokenizer,
--                   e.g. the random test models); default when no prompt is given and the
--                   model has no tokenizer (C = 4)
--   --seed S        seed of the random prompts (default 1)
--   --set k=v       a FastKV parameter (mode, tsp_rate, retain_rate, tsp_len, capacity, w,
--                   kernel, pool), repeatable; tsp_layer is what is being searched
--   --policy PATH   the FastKV policy file (default: policies/fastkv.lua next to this tool)
--   --threads N     CPU threads of the model (default: automatic)
-- A prompt is a file (its text is read) or literal text; without prompts and with a tokenizer,
-- a built-in synthetic passkey haystack of --len tokens is used (better: pass real documents).
-- Example: build/kvsieve run tools/fastkv_calibrate.lua models/llama --lmax 16 a.txt b.txt
local ks = require "kvsieve"

local function usage(msg)
  io.stderr:write((msg and ("fastkv_calibrate: " .. msg .. "\n") or "") ..
    "usage: kvsieve run tools/fastkv_calibrate.lua MODEL_DIR [--lmax N] [--tmin N] [--tol X] [--len N]\n" ..
    "       [--random C] [--seed S] [--set k=v]... [--policy PATH] [--threads N] [prompt-or-file ...]\n")
  os.exit(2)
end

-- ---------------------------------------------------------------- arguments
local argv = { ... }
local opt = { tol = 0.01, len = 2048, seed = 1, tmin = 0, sets = {} }
local prompts_in = {}
local model_dir
local i = 1
local function value()
  i = i + 1
  if argv[i] == nil then usage("option " .. argv[i - 1] .. " needs a value") end
  return argv[i]
end
local function number(s, what)
  local v = tonumber(s)
  if not v then usage(what .. " must be a number, got '" .. tostring(s) .. "'") end
  return v
end
while i <= #argv do
  local a = argv[i]
  if a == "--lmax" then opt.lmax = math.tointeger(number(value(), "--lmax"))
  elseif a == "--tmin" then opt.tmin = math.tointeger(number(value(), "--tmin"))
  elseif a == "--tol" then opt.tol = number(value(), "--tol")
  elseif a == "--len" then opt.len = math.tointeger(number(value(), "--len"))
  elseif a == "--random" then opt.random = math.tointeger(number(value(), "--random"))
  elseif a == "--seed" then opt.seed = math.tointeger(number(value(), "--seed"))
  elseif a == "--threads" then opt.threads = math.tointeger(number(value(), "--threads"))
  elseif a == "--policy" then opt.policy = value()
  elseif a == "--set" then
    local k, v = value():match("^([%w_]+)=(.*)$")
    if not k then usage("--set expects key=value") end
    if k == "tsp_layer" then usage("tsp_layer is what this program searches (use --tmin / --lmax)") end
    opt.sets[k] = tonumber(v) or (v == "true" and true) or (v == "false" and false) or v
  elseif a == "-h" or a == "--help" then usage()
  elseif a:sub(1, 2) == "--" then usage("unknown option " .. a)
  elseif not model_dir then model_dir = a
  else prompts_in[#prompts_in + 1] = a end
  i = i + 1
end
if not model_dir then usage() end

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local policy_path = opt.policy or (here .. "/../policies/fastkv.lua")
local FASTKV = dofile(policy_path)
assert(type(FASTKV) == "table" and FASTKV.prefill_qkv, policy_path .. " is not the FastKV policy")

-- ---------------------------------------------------------------- model and prompts
local m = ks.load(model_dir, opt.threads and { threads = opt.threads } or nil)
local cfg = m.config
local L = cfg.n_layers
local lmax = opt.lmax or L // 2
if lmax > L - 2 then lmax = L - 2 end -- TSP after the last layer saves nothing
local tmin = math.max(0, opt.tmin)
if tmin > lmax then usage(string.format("no candidate layer: tmin %d > lmax %d (the model has %d layers)", tmin, lmax, L)) end
local len = math.min(opt.len, cfg.max_pos - 2)

local prompts, labels = {}, {}
local function add(ids, label)
  if #ids > len then
    local cut = {}
    for j = 1, len do cut[j] = ids[j] end
    ids = cut
  end
  prompts[#prompts + 1], labels[#labels + 1] = ids, label
end

if opt.random or (#prompts_in == 0 and not m.has_tokenizer) then
  math.randomseed(opt.seed)
  local lo = math.min(3, cfg.vocab - 1) -- skip the usual special ids
  for c = 1, opt.random or 4 do
    local ids = {}
    for j = 1, len do ids[j] = math.random(lo, cfg.vocab - 1) end
    add(ids, string.format("random #%d", c))
  end
end
for _, p in ipairs(prompts_in) do
  if not m.has_tokenizer then usage("the model has no tokenizer: use --random C") end
  local text = read_file(p)
  add(m:encode(text or p), text and p or string.format("text %q", p:sub(1, 24)))
end
if #prompts == 0 then
  -- built-in: a passkey haystack (RULER / InfiniteBench style filler) of about len tokens
  local filler = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
  local parts, key = { "There is important info hidden inside a lot of irrelevant text. Find it and memorize it.\n" }, "68142"
  local probe = #m:encode(filler, { special = false })
  local reps = math.max(1, (len - 60) // math.max(probe, 1))
  for j = 1, reps do
    parts[#parts + 1] = filler
    if j == reps // 2 then parts[#parts + 1] = "The pass key is " .. key .. ". Remember it. " .. key .. " is the pass key. " end
  end
  parts[#parts + 1] = "\nWhat is the pass key? The pass key is"
  add(m:encode(table.concat(parts)), "built-in passkey haystack")
end

-- ---------------------------------------------------------------- runs
local s = m:session()

-- The final layer's output at the last prompt row, and the first generated token.
local function run(ids, t)
  local h
  local capture = function(ev)
    if ev.layer == ev.n_layers - 1 then h = ev.hidden:row(ev.n - 1):clone() end
  end
  local pol
  if t == nil then
    pol = { name = "full_capture", prefill_layer_end = capture }
  else
    pol = { name = "fastkv_capture", params = FASTKV.params, begin = FASTKV.begin, prefill_qkv = FASTKV.prefill_qkv,
            prefill_layer_end = capture }
  end
  local set
  if t ~= nil then
    set = { tsp_layer = t }
    for k, v in pairs(opt.sets) do set[k] = v end
  end
  local r = s:generate(ids, { n = 1, policy = pol, set = set })
  assert(h, "no hidden state captured (the pass stopped early?)")
  return h, r.ids[1], t ~= nil and r.report.propagated == true, r.active_rows[L]
end

local desc = {}
for k, v in pairs(FASTKV.params) do
  if k ~= "tsp_layer" and k ~= "trace" then desc[#desc + 1] = k .. "=" .. tostring(opt.sets[k] == nil and v or opt.sets[k]) end
end
table.sort(desc)
local ntok = 0
for _, p in ipairs(prompts) do ntok = ntok + #p end
print(string.format("FastKV TSP-layer calibration (Eq. 3) — %s: %d layers; %d prompt(s), %.0f tokens on average",
  model_dir, L, #prompts, ntok / #prompts))
print("FastKV parameters: " .. table.concat(desc, " "))
for j, lab in ipairs(labels) do print(string.format("  prompt %d: %s (%d tokens)", j, lab, #prompts[j])) end

local base = {}
for j, ids in ipairs(prompts) do
  local h, tok = run(ids)
  base[j] = { h = h, tok = tok, norm2 = ks.sum(h * h) }
end

local rows = {}
for t = tmin, lmax do
  -- means over the prompts that really propagated at t (the others ran full context)
  local cs, d2, agree, prop, active, worst = 0, 0, 0, 0, 0, 1
  for j, ids in ipairs(prompts) do
    local h, tok, propagated, act = run(ids, t)
    if propagated then
      local c = ks.cosine(base[j].h, h)
      local diff = base[j].h - h
      cs = cs + c
      worst = math.min(worst, c)
      d2 = d2 + ks.sum(diff * diff) / math.max(base[j].norm2, 1e-30)
      if tok == base[j].tok then agree = agree + 1 end
      prop = prop + 1
      active = active + act
    end
  end
  local N = math.max(prop, 1)
  rows[#rows + 1] = { t = t, cos = prop > 0 and cs / N or 0 / 0, worst = worst, d2 = prop > 0 and d2 / N or 0 / 0,
                      agree = agree, prop = prop, active = active / N }
end

print(string.format("\n%4s  %10s  %10s  %12s  %9s  %10s  %s", "t", "cos mean", "cos min", "rel |dH|^2", "top1 same",
  "propagated", "rows after t"))
local best, best_d2
for _, r in ipairs(rows) do
  if r.prop > 0 and (not best or r.cos > best.cos) then best = r end
  if r.prop > 0 and (not best_d2 or r.d2 < best_d2.d2) then best_d2 = r end
end
local chosen
for _, r in ipairs(rows) do
  if best and r.prop > 0 and r.cos >= best.cos - opt.tol then chosen = r break end
end
for _, r in ipairs(rows) do
  if r.prop > 0 then
    print(string.format("%4d  %10.6f  %10.6f  %12.4e  %5d/%-3d  %6d/%-3d  %.0f%s", r.t, r.cos, r.worst, r.d2, r.agree, r.prop,
      r.prop, #prompts, r.active, r == chosen and "   <- chosen" or ""))
  else
    print(string.format("%4d  %10s  %10s  %12s  %9s  %6d/%-3d", r.t, "-", "-", "-", "-", 0, #prompts))
  end
end
if best then
  print(string.format("\nbest mean cosine %.6f at t = %d; Eq. 3 argmin (mean relative squared distance) at t = %d",
    best.cos, best.t, best_d2.t))
end
if chosen then
  print(string.format("chosen: t = %d, the earliest layer <= %d whose mean cosine is within %g of the best", chosen.t, lmax, opt.tol))
  print(string.format("use: --policy fastkv --set tsp_layer=%d", chosen.t))
else
  print("no candidate layer propagated: the prompts are too short for FastKV's capacities (use longer prompts or --len)")
end
for _, r in ipairs(rows) do
  if r.prop < #prompts then
    print(string.format("note: at t = %d, %d of %d prompts did not propagate (too short for the capacities) and are left out",
      r.t, #prompts - r.prop, #prompts))
    break
  end
end
