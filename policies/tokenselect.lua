-- tokenselect.lua — TokenSelect: dynamic token-level sparse attention at every layer, for every
-- prefill chunk and every decode step; keys are kept before RoPE and each attention step sees a
-- selected subset of the rows, renumbered contiguously.
--
-- Paper: Wu et al., "TokenSelect: Efficient Long-Context Inference and Length Extrapolation for
-- LLMs via Dynamic Token-Level KV Cache Selection" (shared/papers/tokenselect.txt); reference
-- code pzs19/TokenSelect. Semantics: shared/POLICIES.md "tokenselect".
--
-- What it does. The KV cache holds keys BEFORE RoPE (pre_rope_keys = true): ev.q, ev.k and
-- ev:kv_keys() are unrotated and the engine's attention rotates keys and queries at the
-- positions it is given. The prompt is prefilled in chunks of prefill_chunk (512) rows. For each
-- chunk (prefill_qkv) and each decode step (decode_qkv), at every layer, with N = the layer's
-- rows including the ones this step appends:
--   1. if n_init + k + n_local >= N: nothing to select, attend to all N rows (no action);
--   2. fingerprint = mean over the step's query rows i of RoPE(q_i, n_local + i) (ks.rope: the
--      model's own RoPE) -> (H, d); a decode step's one row is rotated by ks.scores itself
--      (its rope option: the same rotation, inside the scores kernel on a GPU);
--   3. per query head h: s = fingerprint[h] . k_pre[kv(h), j] for the candidate rows
--      j in [n_init, N - n_local) (no 1/sqrt(d)); softmax over the candidates per head; summed
--      over the heads (the "head soft vote"); optionally max-pooled (pool_kernel);
--   4. top-k of the vote (ties to the lower row), sorted;
--   5. attend to [0, n_init) ++ top-k ++ [N - n_local, N) with renumber = true: key j of that list
--      sits at position j, the step's query i at kv_len - qo_len + i (what the engine does), so
--      positions never exceed n_init + k + n_local (the paper's length extrapolation).
-- Selection cache (the paper's Algorithm 1; decode steps only): per layer, while the cosine
-- similarity of the step's fingerprint with the cached one is >= cache_theta, the cached
-- selection (absolute row indices) is reused; otherwise the selection is recomputed and the
-- selection and fingerprint are cached (the cached fingerprint changes only on a miss). The
-- first sparse decode step of each layer always selects. Dense steps neither use nor fill it.
-- The decision is made where the tensors are (without trace): ks.ge turns the cosine into a
-- mask, ks.scores and ks.topk skip their work under it (a hit reads no key) and ks.where keeps
-- the cached list and fingerprint by it, so on a GPU no step waits for the host; the hits are
-- counted on the device and read once a token (the token event). With trace (which prints each
-- cosine) the cosine is read and compared in Lua: the same decisions.
--
-- Parameters (defaults: the paper's / release's settings):
--   n_init          128    leading rows always attended ("attention sinks")
--   n_local         512    trailing rows always attended (the chunk's own rows are among them)
--   k               2048   selected rows per step and layer
--   pool_kernel     0      max pooling of the vote before top-k (odd kernel; 0 or 1 = off)
--   gqa             "div"  query head h scores against KV head h // g (the model's mapping);
--                          "mod": h % n_kv_heads, the released kernel's mapping (reproduction)
--   cache_theta     0.0    selection cache threshold (0 = off; the paper uses 0.9; <= -1: every step
--                          after a layer's first selection hits, without computing the cosine, the
--                          measurement mode of the hit path)
--   sparse_prefill  true   false: the prefill attends to everything (only decode is sparse)
--   trace           false  true: report every selection ("p<chunk>.l<layer>" and
--                          "d<step>.l<layer>" -> "dense" or comma-separated rows; with the cache
--                          "c<step>.l<layer>" -> "first" | "hit <cos>" | "miss <cos>")
--   trace_scores    ""     comma-separated steps, e.g. "p15,d0": report the head vote (before
--                          pooling) at those prefill chunks / decode steps for every layer as
--                          "v.<step>.l<layer>" (and "pv.<step>.l<layer>" pooled)
-- The prefill chunk is the policy table's prefill_chunk below (512 rows; a prompt that fits in one
-- chunk is prefilled in one pass and treated as one chunk). It is not a parameter: the runtime
-- reads prefill_chunk once, when the policy is loaded.
-- Reports: "selections" (top-k computed), "cache_hits" and "cache_misses" (with the cache on;
-- misses include each layer's first sparse decode step; without trace the decisions made on the
-- device are counted at each token event, so a caller of bare decode steps reads them with
-- trace). With cache_theta <= -1 (and no trace) the attend is held (ev:attend's hold): the
-- engine repeats it at the layer's later decode steps without calling decode_qkv, so a step whose
-- every layer hits runs no Lua (one recorded graph on a GPU); those hits are the engine's
-- ev.held_steps, added to cache_hits. Without trace or pooling a decode step's attend declares
-- replay (ev:attend's replay): its candidates are given relative to the layer's end, and the
-- selection cache's state (the cached list, the fingerprint, the hit counter) is written in place
-- (ks.where / ks.add's into), so on a GPU the engine records the step's handlers once and replays
-- them at the following steps without calling decode_qkv (one Lua call a step, the token
-- event's); ev.replayed_steps counts those layer steps, added to "selections" (with the cache,
-- to its decisions: the token event reads the device's hit counter once).
--
-- Deliberate differences from the reference implementation:
--   - GQA: the release scores query head h against KV head h % n_kv_heads; the model (and this
--     policy by default) uses h // g. gqa = "mod" reproduces the release.
--   - The selection cache is disabled and broken in the release; here it works as Algorithm 1
--     describes (decode only, per layer, cosine of the flattened (H*d) fingerprints).
--   - The vote's softmax uses a double denominator and the head sum accumulates in double (the
--     release works in float32/bf16): only near ties can differ; exact ties (equal token ids at
--     layer 0, max-pool plateaus) go to the lower row as in the reference.
--   - A prefill chunk longer than n_init + k + n_local is refused with an error (its first
--     queries would see no key; tools/policy_ref.py refuses that configuration too).
local ks = require "kvsieve"

local state = {}

local function _reset()
  state = { pchunk = {}, dstep = {}, cache = {}, selections = 0, hits = 0, misses = 0, trace_at = {}, decided = 0,
            hits_read = 0, replays_read = 0 }
end
_reset()

-- "p15,d0" -> set of step names
local function _parse_steps(s)
  local t = {}
  for w in string.gmatch(s or "", "[^,%s]+") do t[w] = true end
  return t
end

local function _list_str(t)
  return table.concat(t:tolist(), ",")
end

-- Head soft vote over the candidate rows [lo, hi) of K (rows, Hkv, d), pooled if asked, and
-- the sorted top-k rows (absolute indices). fp (H, d) is the rotated fingerprint, or with rpos
-- the query row that ks.scores rotates at rpos itself (on a GPU inside the scores kernel).
local function _select(ev, p, fp, K, lo, hi, step, rpos, skip)
  local vote = ks.scores(fp, K, { scale = "none", softmax = true, key_range = { lo, hi }, out = { lo, hi },
                                  reduce = "sum", gqa = p.gqa, rope = rpos, skip = skip })
  local pooled = vote
  if p.pool_kernel > 1 then pooled = ks.pool1d(vote, p.pool_kernel, "max") end
  -- the candidates' rows (sorted, ties to the lower row): vote column j is row lo + j
  local top = ks.topk(pooled, p.k, { values = false, base = lo, skip = skip })
  if state.trace_at[step] then
    ev:report("v." .. step .. ".l" .. ev.layer, _list_str(vote))
    if pooled ~= vote then ev:report("pv." .. step .. ".l" .. ev.layer, _list_str(pooled)) end
  end
  state.selections = state.selections + 1
  if not skip then ev:report("selections", state.selections) end
  return top
end

-- [0, n_init) ++ sel ++ [N - n_local, N): sel is ks.topk's sorted result inside [n_init, N - n_local),
-- valid by construction, so ev:attend takes it on the device without a check, and the row ranges
-- around it are read where they are (no list is built where the backend reads ranges itself).
-- hold: the engine may repeat this attend (the trailing rows moving with the layer's rows) at
-- the layer's later decode steps without calling decode_qkv (the hit path: nothing to decide).
local function _attend(ev, p, sel, N, hold, replay)
  ev:attend(sel, { renumber = true, before = { 0, p.n_init }, after = { N - p.n_local, N }, hold = hold, replay = replay })
end

local function _check(p)
  if not ks.rope then error("this runtime lacks ks.rope (lua/ext_rope.c): TokenSelect needs it to rotate its fingerprints") end
  if p.n_init < 0 or p.n_local < 1 or p.k < 1 then
    error(string.format("n_init (%d) must be >= 0, n_local (%d) and k (%d) >= 1", p.n_init, p.n_local, p.k))
  end
  if p.gqa ~= "div" and p.gqa ~= "mod" then error("gqa must be \"div\" or \"mod\", got \"" .. tostring(p.gqa) .. "\"") end
  if p.pool_kernel > 1 and p.pool_kernel % 2 == 0 then error("pool_kernel must be odd, got " .. p.pool_kernel) end
end

return {
  name = "tokenselect",
  description = "TokenSelect: per-step top-k token selection by a head soft vote over pre-RoPE keys, every layer, renumbered positions",
  paper = "Wu et al., TokenSelect: Efficient Long-Context Inference and Length Extrapolation for LLMs via Dynamic Token-Level KV Cache Selection",
  pre_rope_keys = true,
  prefill_chunk = 512,
  params = {
    n_init = 128,
    n_local = 512,
    k = 2048,
    pool_kernel = 0,
    gqa = "div",
    cache_theta = 0.0,
    sparse_prefill = true,
    trace = false,
    trace_scores = "",
  },

  begin = function(p)
    _check(p)
    _reset()
    state.trace_at = _parse_steps(p.trace_scores)
  end,

  -- One prefill chunk of ev.n rows at one layer; the layer holds kv_rows rows before it.
  prefill_qkv = function(ev, p)
    local l = ev.layer
    local c = state.pchunk[l] or 0
    state.pchunk[l] = c + 1
    if not p.sparse_prefill then return end
    local n, kv_n = ev.n, ev.kv_rows[1]
    local N = kv_n + n
    local step = "p" .. c
    if p.n_init + p.k + p.n_local >= N then
      if p.trace then ev:report(step .. ".l" .. l, "dense") end
      return
    end
    if n > p.n_init + p.k + p.n_local then
      error(string.format("a prefill chunk of %d rows exceeds n_init + k + n_local = %d (its first queries would "
        .. "see no key): raise k or n_local, or lower prefill_chunk", n, p.n_init + p.k + p.n_local))
    end
    local fp = ks.mean(ks.rope(ev.q, ks.arange(p.n_local, p.n_local + n)), 0)   -- (H, d)
    local lo, hi = p.n_init, N - p.n_local
    local K = ev:kv_keys()                      -- the rows before this chunk, pre-RoPE
    if hi > kv_n then
      -- n_local < n: some candidates are this chunk's own rows (not in the cache yet)
      if kv_n == 0 then K = ev.k
      else K = ks.concat(K:reshape(-1), ev.k:reshape(-1)):reshape(N, ev.n_kv_heads, ev.head_dim) end
    end
    local sel = _select(ev, p, fp, K, lo, hi, step)
    if p.trace then ev:report(step .. ".l" .. l, _list_str(sel)) end
    _attend(ev, p, sel, N)
  end,

  -- Once a token (generation): the hits that held steps made, counted by the engine, and those the
  -- device decided since the last token (one read: the step is over).
  token = function(ev, p)
    if p.cache_theta == 0 then
      -- the selections the replayed handlers made (their steps ran no Lua)
      local r = ev.replayed_steps
      if r > 0 then ev:report("selections", state.selections + r) end
      return
    end
    if state.hitc then
      -- the hits counted on the device since the start (a float: exact to 2^24), and the layer
      -- steps decided there: by this handler, or by its replays (ev.replayed_steps)
      local total, r = math.tointeger(state.hitc:item()), ev.replayed_steps
      local h, replayed = total - state.hits_read, r - state.replays_read
      state.hits_read, state.replays_read = total, r
      local decided = state.decided + replayed
      state.hits, state.misses = state.hits + h, state.misses + decided - h
      -- the replays' selections were not counted; the skipped ones were counted as made
      state.selections = state.selections + replayed - h
      state.decided = 0
      ev:report("selections", state.selections)
      ev:report("cache_misses", state.misses)
      ev:report("cache_hits", state.hits + ev.held_steps)
    elseif ev.held_steps > 0 then
      ev:report("cache_hits", state.hits + ev.held_steps)
    end
  end,

  -- One decode step at one layer; the new row is already in the layer (N rows).
  decode_qkv = function(ev, p)
    local l = ev.layer
    local s = state.dstep[l] or 0
    state.dstep[l] = s + 1
    local N = ev.kv_rows[1]
    local step = "d" .. s
    if p.n_init + p.k + p.n_local >= N then
      if p.trace then ev:report(step .. ".l" .. l, "dense") end
      return
    end
    local sel
    if p.cache_theta ~= 0 then
      local cached = state.cache[l]
      -- the fingerprint (1, H, d): one query row, at n_local; a hit at cache_theta <= -1 needs none
      local fp = (not cached or p.cache_theta > -1) and ks.rope(ev.q, p.n_local) or nil
      local flat = fp and fp:reshape(-1)
      local what
      if cached and p.cache_theta <= -1 then
        -- every cosine is >= -1: a hit without computing it (no read of the device value)
        sel = cached.sel
        state.hits = state.hits + 1
        what = "hit"
      elseif cached and not p.trace and next(state.trace_at) == nil then
        -- the decision stays where the data is: a mask of cosine >= cache_theta, the scores
        -- skipped under it (a hit reads no keys) and the cached or the new list picked by it,
        -- written over the cached one in place (as is the fingerprint, and the hits added to one
        -- counter); nothing is read back until the token event counts the hits. The candidates
        -- end n_local rows before the layer's end, given from the end: so the step's work is a
        -- function of its query, its keys and the tensors it writes in place, and the engine may
        -- record it and replay it at later steps without calling this handler (ev.replayed_steps)
        local hit = ks.ge(ks.cosine(flat:reshape(1, -1), cached.fp:reshape(1, -1)), p.cache_theta)
        local top = _select(ev, p, fp:reshape(ev.n_heads, ev.head_dim), ev:kv_keys(), p.n_init, -p.n_local, step,
                            nil, hit)
        ks.where(hit, cached.sel, top, { into = cached.sel })
        ks.where(hit, cached.fp, flat, { into = cached.fp })
        if state.hitc then ks.add(state.hitc, hit, { into = state.hitc }) else state.hitc = hit:clone() end
        state.decided = state.decided + 1
        _attend(ev, p, cached.sel, N, nil, p.pool_kernel <= 1)
        return
      elseif cached then
        local cos = ks.cosine(flat, cached.fp)
        if cos >= p.cache_theta then
          sel = cached.sel
          state.hits = state.hits + 1
          what = string.format("hit %.9g", cos)
        else
          what = string.format("miss %.9g", cos)
        end
      else
        what = "first"
      end
      if not sel then
        sel = _select(ev, p, fp:reshape(ev.n_heads, ev.head_dim), ev:kv_keys(), p.n_init, N - p.n_local, step)
        state.cache[l] = { fp = flat:clone(), sel = sel }   -- owned: later steps may write them in place
        state.misses = state.misses + 1
      end
      ev:report("cache_hits", state.hits + ev.held_steps)
      ev:report("cache_misses", state.misses)
      if p.trace then ev:report("c" .. s .. ".l" .. l, what) end
      -- cache_theta <= -1: every later step of this layer hits, so the engine may repeat the
      -- attend itself (a held step is a hit the engine counts: ev.held_steps)
      if p.cache_theta <= -1 and not p.trace then
        _attend(ev, p, sel, N, true)
        return
      end
    else
      -- the fingerprint: the one query row rotated at n_local, which ks.scores does as it reads it;
      -- the candidates end n_local rows before the layer's end (given from the end: at a replay of
      -- a recorded step they follow the rows)
      sel = _select(ev, p, ev.q:reshape(ev.n_heads, ev.head_dim), ev:kv_keys(), p.n_init, -p.n_local, step, p.n_local)
      if not p.trace and next(state.trace_at) == nil and p.pool_kernel <= 1 then
        -- a function of the step's query and keys alone: the engine may record it and replay it
        -- at later steps without calling this handler (ev.replayed_steps counts those)
        _attend(ev, p, sel, N, nil, true)
        return
      end
    end
    if p.trace then ev:report(step .. ".l" .. l, _list_str(sel)) end
    _attend(ev, p, sel, N)
  end,
}
