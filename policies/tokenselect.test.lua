-- tokenselect.test.lua — tests of policies/tokenselect.lua (run by tests/test_policies.c from
-- the repository root, or `kvsieve run policies/tokenselect.test.lua`).
--   1. ks.rope against a naive rotation (and its errors);
--   2. budget >= prompt (n_init + k + n_local >= n + generated): the generated ids equal full
--      attention's (nothing selected; keys kept pre-RoPE and rotated by attention only), with
--      the fixtures' chunking and with the default parameters;
--   3. n_local < chunk (a chunk's own rows become candidates): structural checks; a chunk longer
--      than n_init + k + n_local is refused;
--   4. every fixture case of tests/fixtures/policies/cases/<model>/tokenselect/ (tools/policy_ref.py;
--      stories260K, from $KS_SHARED (default ../shared), is skipped when absent): per prefill chunk and
--      decode step, per layer, dense or the selected rows; the selection cache's first / hit /
--      miss and cosine; the head votes of `debug_scores`; the generated ids (while
--      step_margins > 1e-3). Every selection of every layer and step is compared and must be
--      equal; it may differ only at a boundary the reference records as an exact or near tie
--      (rel_gap <= 1e-4), and then only in rows whose votes (ours, traced at that step) lie
--      within 1e-4 of our k-th value, with exact ties of ours going to the lower row. There the
--      test forces the reference's choice (a test-only copy of the policy, policy_copy) and runs
--      again, so that the deeper layers, later steps and generated ids are compared as well.
-- The fixtures prefill in chunks of 64: the test runs a temporary copy of the policy file whose
-- prefill_chunk is the fixture's (the runtime reads prefill_chunk when the policy is loaded).
package.path = "tests/lua/?.lua;" .. package.path
local ks = require "kvsieve"
local json = require "json"

if not ks.rope then
  error("tokenselect: ks.rope is missing from the primitive registry (lua/prims_lua.c; lua/ext_rope.c implements it)", 0)
end

local polfix = require "polfix"

local FIX = polfix.ROOT
local POLICY = "policies/tokenselect.lua"
local STORIES = polfix.STORIES
local VARIANTS = { "base", "mapmod", "pool3", "denseprefill", "cache" }

local fail, file_exists, split_ints, list_str = polfix.fail, polfix.readable, polfix.split_ints, polfix.fmt_list

local function read_all(p)
  local f = assert(io.open(p, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

-- A copy of the policy with another prefill chunk and, for the fixture comparison only, some
-- selections forced (a temporary file; removed at the end). forced = { ["p6.l0"] = { rows } }:
-- at that step and layer the copy attends to these rows instead of its own top-k (its votes
-- are still computed and traced). The test feeds the reference's choice forward this way where
-- the two differ at a verified tie, so that every later selection stays comparable.
local tmp_files = {}
local function policy_copy(chunk, forced)
  local src = read_all(POLICY)
  local out, n = src:gsub("\n  prefill_chunk = %d+,\n", "\n  prefill_chunk = " .. chunk .. ",\n")
  if n ~= 1 then fail("%s: expected one 'prefill_chunk = N,' line, found %d", POLICY, n) end
  if forced and next(forced) then
    local keys, items = {}, {}
    for k in pairs(forced) do keys[#keys + 1] = k end
    table.sort(keys)
    for _, k in ipairs(keys) do items[#items + 1] = string.format("[%q] = { %s }", k, table.concat(forced[k], ", ")) end
    local tbl = "local _FORCED = { " .. table.concat(items, ", ") .. " } -- tokenselect.test.lua: forced selections\n"
    out, n = out:gsub("\nlocal ks = require \"kvsieve\"\n", function(m) return m .. tbl end)
    if n ~= 1 then fail("%s: expected one 'local ks = require \"kvsieve\"' line, found %d", POLICY, n) end
    out, n = out:gsub("\n  return top\nend\n", function()
      return "\n  local forced = _FORCED[step .. \".l\" .. ev.layer]\n"
        .. "  if forced then return ks.tensor(forced, \"i32\") end\n  return top\nend\n"
    end)
    if n ~= 1 then fail("%s: expected one 'return top' line ending _select, found %d", POLICY, n) end
  end
  local path = os.tmpname()
  local f = assert(io.open(path, "wb"))
  f:write(out)
  f:close()
  tmp_files[#tmp_files + 1] = path
  return path
end

local function split_nums(s)
  local t = {}
  for w in string.gmatch(s, "[^,]+") do t[#t + 1] = tonumber(w) end
  return t
end

local function set_of(list)
  local t = {}
  for _, v in ipairs(list) do t[v] = true end
  return t
end

local function same_list(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

-- ---------------------------------------------------------------- ks.rope
do
  local x = ks.tensor({ { { 1, 2, 3, 4 }, { 5, 6, 7, 8 } }, { { 0.5, -1, 2, 0.25 }, { 0, 1, 0, 0 } } }, "f32")
  local pos = { 3, 100 }
  local y = ks.rope(x, pos, { theta = 10000 }):tolist()
  local xl = x:tolist()
  for i = 1, 2 do
    for h = 1, 2 do
      for k = 1, 2 do
        local inv = 1 / 10000 ^ ((2 * (k - 1)) / 4)
        local a = pos[i] * inv
        local x0, x1 = xl[i][h][k], xl[i][h][k + 2]
        local e0, e1 = x0 * math.cos(a) - x1 * math.sin(a), x1 * math.cos(a) + x0 * math.sin(a)
        if math.abs(y[i][h][k] - e0) > 1e-4 or math.abs(y[i][h][k + 2] - e1) > 1e-4 then
          fail("rope: row %d head %d pair %d: got (%g, %g), expected (%g, %g)", i, h, k, y[i][h][k], y[i][h][k + 2], e0, e1)
        end
      end
    end
  end
  local y2 = ks.rope(x:row(1), 100, { theta = 10000 }):tolist()   -- (H, d) at one position
  for h = 1, 2 do for j = 1, 4 do assert(y2[h][j] == y[2][h][j], "rope: (H, d) form differs") end end
  local ok, e = pcall(ks.rope, x, pos)
  assert(not ok and tostring(e):find("only inside an event handler", 1, true), tostring(e))
  ok, e = pcall(ks.rope, x, { 1, 2, 3 }, { theta = 10 })
  assert(not ok and tostring(e):find("3 positions for 2 rows", 1, true), tostring(e))
  print("tokenselect: ks.rope matches a naive rotation")
end

-- ---------------------------------------------------------------- one fixture case
local SCORE_TOL = 1e-4   -- relative to the largest vote value (observed: < 1e-5)
local MAX_FORCED = 16    -- ties fed forward per case before the test gives up

-- The case's selections in causal order: prefill chunk by chunk, then decode step by step;
-- layer by layer within each (a selection depends only on those before it in this order).
local function selections_of(d)
  local out = {}
  if d.prefill ~= json.null then
    for _, ch in ipairs(d.prefill) do
      for li, rec in ipairs(ch.layers) do
        out[#out + 1] = { key = "p" .. ch.chunk .. ".l" .. (li - 1), step = "p" .. ch.chunk, rec = rec, l = li - 1 }
      end
    end
  end
  for _, st in ipairs(d.decode) do
    for li, rec in ipairs(st.layers) do
      out[#out + 1] = { key = "d" .. st.step .. ".l" .. (li - 1), step = "d" .. st.step, rec = rec, l = li - 1,
                        dstep = st.step, token = st.token }
    end
  end
  return out
end

local function is_tie(b) return b and b ~= json.null and (b.exact_tie or b.near_tie or b.rel_gap <= 1e-4) end

-- Every selection of the case is compared. Where ours differs from the reference's at a
-- boundary the reference records as an exact or near tie (rel_gap <= 1e-4: the two
-- implementations' votes differ by ~1e-5 relative, and the reference's batched einsum can
-- give equal keys — equal token ids, max-pool plateaus — values that differ by float noise,
-- so its exact tie groups can miss rows exactly tied here), the difference is verified from
-- our own votes (traced at that step): every differing row holds our k-th value within 1e-4
-- relative, and of rows tied exactly here the lower one was taken. Then the reference's
-- choice is forced at that selection (policy_copy) and the case runs again, so the layers and
-- steps after it are compared too, as are all generated ids (while the reference's margin is
-- > 1e-3). Any other difference fails.
local function check_case(m, s, chunk, d, label)
  local P = d.params
  local trace_at = {}
  for _, e in ipairs(d.debug_scores or {}) do
    trace_at[(e.where == "prefill" and "p" or "d") .. e.index] = true
  end
  local set = {
    n_init = P.n_init, n_local = P.n_local, k = P.k,
    pool_kernel = P.pool_kernel or 0, gqa = P.head_map,
    cache_theta = P.selection_cache and P.cache_theta or 0.0,
    sparse_prefill = P.prefill_mode == "chunked",
    trace = true,
  }
  local sels = selections_of(d)
  local forced, n_forced, notes = {}, 0, {}
  local r, rep, stats, last_ids_step
  local n_runs, prev_mis = 0, 0
  while true do
    local steps = {}
    for k in pairs(trace_at) do steps[#steps + 1] = k end
    table.sort(steps)
    set.trace_scores = table.concat(steps, ",")
    local prev = rep
    r = s:generate(d.prompt_ids, { n = d.n_new, policy = policy_copy(chunk, forced), set = set })
    rep, n_runs = r.report, n_runs + 1
    stats = { compared = 0, equal = 0, ties = 0, hits = 0, cached = 0, scores = 0, worst = 0 }
    last_ids_step = nil   -- the decode steps from here on were fed another token than the reference's
    local mismatch
    for i, q in ipairs(sels) do
      if q.dstep and r.ids[q.dstep + 1] ~= q.token then last_ids_step = q.dstep break end
      local got, rec = rep[q.key], q.rec
      if got == nil then fail("%s %s: the policy reported nothing", label, q.key) end
      -- up to the previous run's difference, a run (same forced rows, or one more at that
      -- difference) must repeat the previous run exactly
      if prev and i < prev_mis and prev[q.key] ~= got then
        fail("%s %s: the selection is not deterministic (%s, then %s)", label, q.key, tostring(prev[q.key]), tostring(got))
      end
      stats.compared = stats.compared + 1
      if rec.dense then
        if got ~= "dense" then fail("%s %s: reference is dense, policy selected %s", label, q.key, tostring(got)) end
        stats.equal = stats.equal + 1
      else
        if got == "dense" then fail("%s %s: reference selects, the policy attended to everything", label, q.key) end
        local mine = split_ints(tostring(got))
        if #mine ~= #rec.sel then fail("%s %s: %d rows selected, reference %d", label, q.key, #mine, #rec.sel) end
        if not same_list(mine, rec.sel) then mismatch = { q = q, mine = mine, i = i } break end
        if forced[q.key] == nil then
          stats.equal = stats.equal + 1
          if rec.bnd and rec.bnd ~= json.null and rec.bnd.exact_tie then stats.ties = stats.ties + 1 end
        end
      end
      if rec.cache then
        local c = rep["c" .. q.dstep .. ".l" .. q.l]
        if c == nil then fail("%s c%d.l%d: no cache report", label, q.dstep, q.l) end
        local kind, cos = tostring(c):match("^(%a+) ?(.*)$")
        local want = rec.cache.first and "first" or (rec.cache.hit and "hit" or "miss")
        if kind ~= want then fail("%s decode %d layer %d: cache %s, reference %s", label, q.dstep, q.l, kind, want) end
        if rec.cache.cos and math.abs(tonumber(cos) - rec.cache.cos) > 1e-4 then
          fail("%s decode %d layer %d: cache cosine %s, reference %.9g", label, q.dstep, q.l, cos, rec.cache.cos)
        end
        stats.cached = stats.cached + 1
        if kind == "hit" then stats.hits = stats.hits + 1 end
      end
    end
    if not mismatch then break end
    prev_mis = mismatch.i
    -- a difference: allowed only at a tie of the reference, verified from our votes at that step
    local q, mine, b = mismatch.q, mismatch.mine, mismatch.q.rec.bnd
    local missing, extra = polfix.set_diff(mine, q.rec.sel) -- the reference's rows we lack; ours it lacks
    if not is_tie(b) then
      local why = "no tie"
      if b and b ~= json.null and b.exact_tie then
        why = string.format("exact tie at %.9g: group %s, the lowest %d taken", b.kth, list_str(b.tie_group), b.tie_taken)
      elseif b and b ~= json.null then why = string.format("rel_gap %.3g", b.rel_gap) end
      fail("%s %s: selection differs (%s): policy has %s not in the reference, misses %s", label, q.key, why,
        list_str(extra), list_str(missing))
    end
    if not trace_at[q.step] then
      trace_at[q.step] = true   -- run again (the same forced set) with our votes at that step
    else
      local vals = rep["pv." .. q.step .. ".l" .. q.l] or rep["v." .. q.step .. ".l" .. q.l]
      if not vals then fail("%s %s: no votes reported", label, q.key) end
      vals = split_nums(vals)
      local function val(row) return vals[row - P.n_init + 1] end
      local kth = math.huge
      for _, row in ipairs(mine) do kth = math.min(kth, val(row)) end
      local function near(row) return math.abs(val(row) - kth) <= 1e-4 * math.abs(kth) end
      for _, row in ipairs(extra) do
        if not near(row) then fail("%s %s: row %d taken at %.9g, not at the k-th value %.9g", label, q.key, row, val(row), kth) end
      end
      for _, row in ipairs(missing) do
        if not near(row) then
          fail("%s %s: row %d (the reference took it) has %.9g here, not near the k-th value %.9g", label, q.key, row, val(row), kth)
        end
        for _, e in ipairs(extra) do
          if e > row and val(e) == val(row) then
            fail("%s %s: rows %d (taken) and %d (not taken) tie exactly: the lower row must win", label, q.key, e, row)
          end
        end
      end
      n_forced = n_forced + 1
      if n_forced > MAX_FORCED then fail("%s: more than %d selections differ at ties", label, MAX_FORCED) end
      forced[q.key] = q.rec.sel
      local exact_here = false
      for _, x in ipairs(extra) do for _, y in ipairs(missing) do if val(x) == val(y) then exact_here = true end end end
      notes[#notes + 1] = string.format("  %s %s: tie at the boundary (%s; %s here): the policy took %s, the reference %s; "
        .. "the reference's choice is fed forward", label, q.key,
        b.exact_tie and "exact in the reference" or string.format("rel_gap %.3g in the reference", b.rel_gap),
        exact_here and "exact" or "within 1e-4", list_str(extra), list_str(missing))
    end
  end
  for _, note in ipairs(notes) do print(note) end
  -- decode steps fed another token (only after a generated id at a margin <= 1e-3, see below)
  local not_compared = 0
  if last_ids_step then
    for _, q in ipairs(sels) do if q.dstep and q.dstep >= last_ids_step then not_compared = not_compared + 1 end end
  end
  -- the head votes (and pooled votes) where the fixture has them
  for _, e in ipairs(d.debug_scores or {}) do
    local step = (e.where == "prefill" and "p" or "d") .. e.index
    local comparable = e.where == "prefill" or not last_ids_step or e.index < last_ids_step
    for _, what in ipairs({ { "v.", e.vote }, { "pv.", e.pooled } }) do
      local ref = what[2]
      if ref and ref ~= json.null and comparable then
        local got = rep[what[1] .. step .. ".l" .. e.layer]
        if not got then fail("%s %s%s.l%d: no vote reported", label, what[1], step, e.layer) end
        local mine = split_nums(got)
        if #mine ~= #ref then fail("%s %s%s.l%d: %d values, reference %d", label, what[1], step, e.layer, #mine, #ref) end
        local mx, worst = 0, 0
        for i = 1, #ref do mx = math.max(mx, math.abs(ref[i])) end
        for i = 1, #ref do worst = math.max(worst, math.abs(mine[i] - ref[i]) / mx) end
        if worst > SCORE_TOL then
          fail("%s %s%s.l%d: votes differ by %.3g (relative to the largest)", label, what[1], step, e.layer, worst)
        end
        stats.scores = stats.scores + 1
        stats.worst = math.max(stats.worst, worst)
      end
    end
  end
  -- every generated id, while the reference's margins are comfortable
  local n_cmp, note = 0, ""
  for i, id in ipairs(d.generated_ids) do
    if r.ids[i] ~= id then
      fail("%s: generated id %d is %d, reference %d (margin %.3g); policy %s, reference %s", label, i - 1, r.ids[i], id,
        d.step_margins[i], list_str(r.ids), list_str(d.generated_ids))
    end
    n_cmp = n_cmp + 1
    if d.step_margins[i] <= 1e-3 then
      note = string.format(" (then a margin of %.3g)", d.step_margins[i])
      break
    end
  end
  if not_compared > 0 then note = note .. string.format("; %d decode selections after a different token not compared", not_compared) end
  -- cache reports
  if P.selection_cache then
    if (rep.cache_hits or 0) < 1 or (rep.cache_misses or 0) < 1 then
      fail("%s: the cache case should both hit and miss (hits %s, misses %s)", label, tostring(rep.cache_hits), tostring(rep.cache_misses))
    end
  end
  print(string.format("tokenselect %-28s ok: %d of %d selections compared, %d equal (%d at exact ties), %d differ at a "
    .. "tie (the reference's fed forward); %d cache checks (%d hits); %d vote rows (within %.1e); %d/%d ids%s; %d runs",
    label, stats.compared, #sels, stats.equal, stats.ties, n_forced, stats.cached, stats.hits, stats.scores, stats.worst,
    n_cmp, #d.generated_ids, note, n_runs))
  return r, { compared = stats.compared, total = #sels, equal = stats.equal, forced = n_forced }
end

-- ---------------------------------------------------------------- per model
local MODELS = {
  { name = "llama12_gqa", dir = FIX .. "models/llama12_gqa" },
  { name = "qwen2_12_bias", dir = FIX .. "models/qwen2_12_bias" },
  { name = "stories260K", dir = STORIES },
}

local totals = { compared = 0, total = 0, equal = 0, forced = 0 }
local ok_all, err = pcall(function()
  local chunk_paths = {}
  for _, mm in ipairs(MODELS) do
    if not file_exists(mm.dir .. "/config.json") then
      polfix.skip_part(mm.name .. ": no model at " .. mm.dir .. " (its cases not run)")
    else
      local m = ks.load(mm.dir, { threads = 1 })   -- tiny models: threads only add overhead
      local s = m:session()
      local first = json.read(FIX .. "cases/" .. mm.name .. "/tokenselect/base.json")
      local prompt, n_new = first.prompt_ids, first.n_new
      local chunk = first.params.chunk
      chunk_paths[chunk] = chunk_paths[chunk] or policy_copy(chunk)
      local path = chunk_paths[chunk]

      -- (1) budget >= prompt: exactly full attention's ids (fixture chunking and the defaults)
      local full = s:generate(prompt, { n = n_new })
      local n = #prompt
      local big = s:generate(prompt, { n = n_new, policy = path,
        set = { n_init = first.params.n_init, n_local = first.params.n_local, k = n + n_new } })
      if not same_list(big.ids, full.ids) then
        fail("%s: budget >= n: ids %s differ from full attention's %s", mm.name, list_str(big.ids), list_str(full.ids))
      end
      if big.report.selections ~= nil then fail("%s: budget >= n selected %s times", mm.name, tostring(big.report.selections)) end
      local def = s:generate(prompt, { n = n_new, policy = "tokenselect" })
      if not same_list(def.ids, full.ids) then
        fail("%s: default parameters (dense here): ids %s differ from full attention's %s", mm.name, list_str(def.ids), list_str(full.ids))
      end
      if not same_list(full.ids, first.full_generated_ids) then
        print(string.format("  %s: note: full attention ids %s, the fixture's %s", mm.name, list_str(full.ids), list_str(first.full_generated_ids)))
      end
      print(string.format("tokenselect %-28s ok: budget >= n gives full attention's ids %s", mm.name, list_str(full.ids)))

      -- n_local < chunk: a chunk's own rows are candidates too (no fixture: structural checks)
      if mm.name == "qwen2_12_bias" then
        local P = { n_init = 16, n_local = 32, k = 48 }
        local rr = s:generate(prompt, { n = 2, policy = path, set = { n_init = P.n_init, n_local = P.n_local, k = P.k, trace = true } })
        local own, sparse = 0, 0
        for c = 0, (n - 1) // chunk do
          local start, N = c * chunk, math.min((c + 1) * chunk, n)
          for l = 0, m.config.n_layers - 1 do
            local got = rr.report["p" .. c .. ".l" .. l]
            if P.n_init + P.k + P.n_local >= N then
              if got ~= "dense" then fail("n_local < chunk: p%d.l%d should be dense, got %s", c, l, tostring(got)) end
            else
              local sel = split_ints(got)
              if #sel ~= P.k then fail("n_local < chunk: p%d.l%d selected %d rows", c, l, #sel) end
              for i, v in ipairs(sel) do
                if v < P.n_init or v >= N - P.n_local or (i > 1 and v <= sel[i - 1]) then
                  fail("n_local < chunk: p%d.l%d: row %d out of [%d, %d) or not ascending", c, l, v, P.n_init, N - P.n_local)
                end
                if v >= start then own = own + 1 end
              end
              sparse = sparse + 1
            end
          end
        end
        if sparse == 0 or own == 0 then fail("n_local < chunk: %d sparse steps selected %d rows of their own chunk", sparse, own) end
        local ok, e = pcall(s.generate, s, prompt, { n = 1, policy = path, set = { n_init = 8, k = 16, n_local = 16 } })
        if ok or not tostring(e):find("exceeds n_init + k + n_local = 40", 1, true) then
          fail("a chunk longer than n_init + k + n_local should be refused, got %s", tostring(e))
        end
        print(string.format("tokenselect %-28s ok: n_local < chunk selects among the chunk's own rows (%d rows in %d steps); "
          .. "an oversized chunk is refused", mm.name, own, sparse))
      end

      -- (2) the fixture cases
      for _, v in ipairs(VARIANTS) do
        local f = FIX .. "cases/" .. mm.name .. "/tokenselect/" .. v .. ".json"
        if file_exists(f) then
          local d = json.read(f)
          if d.params.chunk ~= chunk then fail("%s: chunk %d differs from base's %d", f, d.params.chunk, chunk) end
          local _, c = check_case(m, s, chunk, d, mm.name .. "/" .. v)
          for k, x in pairs(c) do totals[k] = totals[k] + x end
        else
          fail("missing fixture %s", f)
        end
      end
      m:close()
    end
  end
end)
for _, p in ipairs(tmp_files) do os.remove(p) end
if not ok_all then error(err, 0) end
print(string.format("tokenselect fixtures: %d of %d selections compared, %d equal, %d differ at a tie (the reference's "
  .. "choice fed forward)", totals.compared, totals.total, totals.equal, totals.forced))
