-- quest.lua — Quest: query-aware page selection at every decode step. The KV cache is split into
-- pages of `page` rows; each page is summarised by the elementwise min and max of its keys; at
-- each decode step and layer the query scores every page by an upper bound of q.k over that
-- box, and attention reads only the best pages (budget tokens in all) plus the current page.
--
-- Paper: Tang, Zhao, Zhu, Xiao, Kasikci, Han, "Quest: Query-Aware Sparsity for Efficient
-- Long-Context LLM Inference", ICML 2024, arXiv:2406.10774; reference code mit-han-lab/Quest.
--
-- What it does, at each decode step (decode_qkv) of each layer l >= dense_layers, with N = the
-- layer's rows including the one this step appended, P = page:
--   1. last = (N - 1) // P is the page holding the newest row (the "current page", partial or
--      just filled). It is always attended. The candidates are the complete pages [0, last).
--   2. K = budget // P pages are attended in all: the current page and K - 1 candidates. When
--      budget >= N or K - 1 >= last, every row fits: the step attends to everything (no action).
--   3. Page summaries (ks.page_reduce, "minmax"): lo[p], hi[p] = elementwise min / max of the
--      keys of page p, per KV head, over the cache's keys after RoPE (what the cache holds and
--      the query is multiplied with).
--   4. Criticality (ks.bound_scores): for query head h, s[h, p] = sum_i max(q_i lo_i, q_i hi_i),
--      an upper bound of q_h . k for every key k of page p. The query heads sharing a KV head
--      are combined by their max (gqa = "max": the page's bound on the best logit any head of
--      the group can reach; "sum": their sum).
--   5. Per KV head, the top K - 1 candidates (ks.topk, ties to the lower page), expanded to their
--      rows (ks.page_rows), then the current page's rows [last * P, N) (ev:attend's after range,
--      page = P): ev:attend with one list per KV head, at the rows' own positions (no
--      renumbering). Nothing is evicted: the cache keeps every row and the next step chooses
--      again. On a GPU the step stays on the device: top-k's pages and page_rows' rows are valid
--      by construction, so ev:attend takes them without a download (with trace = true, reporting
--      the pages downloads them).
--   Recorded steps: until the current page is full, a step's work is the same function of the
--   device's q and keys (no page joins the candidates, no summary changes), so each layer
--   declares replay within the rows left in the page (ev:attend's replay = rows; the dense layers
--   ev:replay(rows)): the engine may record a step's handlers and replay them without Lua until
--   the page fills, the attended tail following the page ([last * P, N) at each replayed step).
--   The step after a page fills runs Lua (a page joins the summaries), the next one records.
--   The token event adds the replayed layer steps to "selections" (ev.replayed_steps).
-- The prefill attends to everything (Quest accelerates decoding; the paper's prefill is dense).
-- Kept summaries are made as the prefill ends each layer (prefill_layer_end: the prompt's complete
-- pages, as the reference builds its page metadata while it prefills), so the first decode step
-- summarises at most the pages completed since.
--
-- Choices (the paper is written for multi-head attention; the points it leaves open):
--   - Selection per KV head, the group's query heads combined by the max of their bounds (gqa):
--     the engine's attention reads one row list per KV head, and the reference kernels select
--     per head of a model without GQA, so a head group is the finest unit here.
--   - Keys after RoPE, as the reference (its page metadata is built from the rotated keys in the
--     cache); queries after RoPE (ev.q).
--   - Dense layers: the first dense_layers (2) layers attend to everything, as the paper's
--     evaluation skips Quest in the first two layers.
--   - The current page is always attended and counts against the budget; no attention-sink
--     page is forced (the paper forces none).
--   - Summaries: "keep" stores each layer's summaries between steps and computes only pages
--     completed since (a page's summary never changes once it is full); "recompute" summarises
--     all candidate pages at every step (one read of the keys). min / max are exact, so both
--     give the same bits. "box" keeps them as packed bf16 boxes (ks.page_reduce's "box": the
--     min rounded down and the max rounded up to bf16 in one 32-bit word a channel), half the
--     bytes that bound_scores reads at every step; for bf16 keys (the CUDA cache) the box is
--     the exact min and max, so the bounds and pages are those of "keep" bit for bit; for f32
--     keys (the CPU cache) the rounded box is a slightly looser bound, which may choose other
--     pages. "auto" (the default) is "box" when the keys are bf16 (keys.storage) and "keep"
--     otherwise: the same pages as "keep" everywhere. Kept summaries stay where the keys are,
--     on the host or on the device (device tensors a handler keeps stay there for later events:
--     pages x Hkv x d words a layer as boxes, 1 GB for the 8B shape's 30 sparse layers at 128K,
--     within _device_mb's 4096 MB default; twice that as two float arrays).
--
-- Parameters:
--   budget        4096    tokens attended per step and layer (the current page included)
--   page          16      rows per page
--   dense_layers  2       the first layers attend to everything
--   gqa           "max"   how a KV head combines its query heads' bounds: "max" or "sum"
--   summaries     "auto"  "auto" | "box" | "keep" | "recompute" (see above)
--   trace         false   true: report every step's choice: "d<step>.l<layer>" -> "dense", or
--                         the chosen candidate pages of each KV head ("1,4,7|0,4,9")
-- Reports: "selections" (steps and layers that selected), "dense_steps" (steps and layers past
-- dense_layers that attended to everything).
local ks = require "kvsieve"

local state = {}

local function _reset()
  state = { dstep = {}, sum = {}, selections = 0, dense = 0, replays_read = 0 }
end
_reset()

-- Summaries of the complete pages [0, npages) of this layer's keys K (N, Hkv, d): packed boxes
-- (box = true: one i32 tensor) or lo, hi (f32), kept between steps unless p.summaries is
-- "recompute".
local function _summaries(ev, p, K, npages, box)
  local op = box and "box" or "minmax"
  if p.summaries == "recompute" then return ks.page_reduce(K, p.page, op, { pages = { 0, npages } }) end
  local c = state.sum[ev.layer]
  if not c or c.n > npages or c.box ~= box then
    local lo, hi = ks.page_reduce(K, p.page, op, { pages = { 0, npages } })
    c = { lo = lo, hi = hi, n = npages, box = box }
    state.sum[ev.layer] = c
  elseif c.n < npages then
    local lo, hi = ks.page_reduce(K, p.page, op, { pages = { c.n, npages } })
    local Hkv, d = K.shape[2], K.shape[3]
    c.lo = ks.concat(c.lo:reshape(-1), lo:reshape(-1)):reshape(npages, Hkv, d)
    if not box then c.hi = ks.concat(c.hi:reshape(-1), hi:reshape(-1)):reshape(npages, Hkv, d) end
    c.n = npages
  end
  return c.lo, c.hi
end

local function _trace_pages(top)
  local heads = {}
  for h, list in ipairs(top:tolist()) do heads[h] = table.concat(list, ",") end
  return table.concat(heads, "|")
end

return {
  name = "quest",
  description = "Quest: per-page min/max key summaries, page top-k by the upper bound of q.k per KV head, attention over the chosen pages and the current one, every decode step",
  paper = "Tang et al., Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference, ICML 2024 (arXiv:2406.10774)",
  params = {
    budget = 4096,
    page = 16,
    dense_layers = 2,
    gqa = "max",
    summaries = "auto",
    trace = false,
  },

  begin = function(p)
    if p.page < 1 then error(string.format("page (%d) must be >= 1", p.page), 0) end
    if p.budget < p.page then
      error(string.format("budget (%d) must be at least one page (%d): the current page is always attended", p.budget, p.page), 0)
    end
    if p.dense_layers < 0 then error(string.format("dense_layers (%d) must be >= 0", p.dense_layers), 0) end
    if p.gqa ~= "max" and p.gqa ~= "sum" then error("gqa must be \"max\" or \"sum\", got \"" .. tostring(p.gqa) .. "\"", 0) end
    if p.summaries ~= "auto" and p.summaries ~= "box" and p.summaries ~= "keep" and p.summaries ~= "recompute" then
      error("summaries must be \"auto\", \"box\", \"keep\" or \"recompute\", got \"" .. tostring(p.summaries) .. "\"", 0)
    end
    _reset()
  end,

  -- The prompt's complete pages summarised as each layer's keys are final (kept summaries only,
  -- and only where a decode step would select: a prompt longer than the budget).
  prefill_layer_end = function(ev, p)
    if p.summaries == "recompute" or ev.layer < p.dense_layers or p.budget // p.page < 2 then return end
    local N = ev.kv_rows[1]
    local last = (N - 1) // p.page
    if p.budget >= N or p.budget // p.page - 1 >= last then return end
    local keys = ev:kv_keys()
    if state.box == nil then state.box = p.summaries == "box" or (p.summaries == "auto" and keys.storage == "bf16") end
    _summaries(ev, p, keys, last, state.box)
  end,

  -- One decode step at one layer; the new row is already in the layer (N rows).
  decode_qkv = function(ev, p)
    local l = ev.layer
    local s = state.dstep[l] or 0
    state.dstep[l] = s + 1
    local N, P = ev.kv_rows[1], p.page
    local last = (N - 1) // P             -- the current page: always attended
    local K = p.budget // P               -- pages attended, the current one included
    -- rows the current page can still take: this step's work holds until then (a recording of it
    -- replays that many steps); not with trace (it reports from the host) or recomputed summaries
    local within = (last + 1) * P - N
    local replay = not p.trace and p.summaries ~= "recompute" and K > 1 and within >= 1 and
                   p.budget < N and K - 1 < last and within
    if l < p.dense_layers then
      if replay then ev:replay(replay) end
      return
    end
    if p.budget >= N or K - 1 >= last then
      state.dense = state.dense + 1
      ev:report("dense_steps", state.dense)
      if p.trace then ev:report("d" .. s .. ".l" .. l, "dense") end
      return
    end
    local rows
    if K == 1 then
      rows = ks.arange(last * P, N)
      if p.trace then ev:report("d" .. s .. ".l" .. l, "") end
    else
      local keys = ev:kv_keys()           -- (N, Hkv, d), after RoPE
      -- the cache's storage, read at the first selection (a recorded step may not read the keys'
      -- fields: they follow the rows there)
      if state.box == nil then state.box = p.summaries == "box" or (p.summaries == "auto" and keys.storage == "bf16") end
      local box = state.box
      local lo, hi = _summaries(ev, p, keys, last, box)
      local opts = { reduce = p.gqa == "max" and "group_max" or "group_sum" }
      local bound = box and ks.bound_scores(ev.q, lo, opts) or ks.bound_scores(ev.q, lo, hi, opts)
      local top = ks.topk(bound, K - 1, { values = false }) -- (Hkv, K - 1) pages, ascending; ties to the lower page
      if p.trace then ev:report("d" .. s .. ".l" .. l, _trace_pages(top)) end
      -- (Hkv, (K - 1) P) rows of the chosen pages, valid by construction in [0, last P): no check,
      -- no wait; the current page is the attend's trailing range
      rows = ks.page_rows(top, P, last * P)
      state.selections = state.selections + 1
      ev:report("selections", state.selections)
      ev:attend(rows, { after = { last * P, N }, page = P, replay = replay })
      return
    end
    state.selections = state.selections + 1
    ev:report("selections", state.selections)
    ev:attend(rows)
  end,

  -- The selections of the replayed layer steps (they ran no Lua): every layer of a replayed step
  -- replays, the dense ones included.
  token = function(ev, p)
    local r = ev.replayed_steps
    if r > state.replays_read then
      local steps = (r - state.replays_read) // ev.n_layers
      state.replays_read = r
      state.selections = state.selections + steps * (ev.n_layers - math.min(p.dense_layers, ev.n_layers))
      ev:report("selections", state.selections)
    end
  end,
}
