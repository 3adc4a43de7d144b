-- streamingllm.lua — attention sinks + a recent window: KV retention only, every layer.
--
-- Paper: G. Xiao, Y. Tian, B. Chen, S. Han, M. Lewis, "Efficient Streaming Language Models
-- with Attention Sinks" (2023, arXiv:2309.17453). Semantics: shared/POLICIES.md "streamingllm"
-- (the baseline as FastKV's repository runs it).
--
-- What it does. Each layer keeps the first `sinks` KV rows (the attention sinks: positions
-- 0..sinks-1) and the most recent `budget - sinks` rows, with their original positions.
--   * Prefill is full attention. At the end of each layer's prefill (prefill_qkv: the rows
--     are freed after that layer's attention), when the layer then holds more than `budget`
--     rows, it retains sinks + recent ones. A prompt of at most `budget` tokens is untouched.
--   * rolling = false: decode rows are appended and always attended (the cache grows by one
--     row per generated token after the prefill). begin unhooks decode_qkv then, so decode
--     steps make no policy call (and replay as one graph on the CUDA backend).
--   * rolling = true: also at each decode step: once the layer holds more than `budget` rows
--     (the new one included), the step attends only the sinks and the most recent
--     `budget - sinks` rows and the others are freed, so the cache never exceeds `budget` rows
--     (evicted rows never return). begin declares this as the engine's KV ring
--     (ks.kv_ring{sinks, budget}): a full layer's new row overwrites its oldest row after the
--     sinks in place, with no compaction and no policy call, so single-session decode steps
--     replay as one graph on the CUDA backend. decode_qkv (ev:attend + ev:retain of the same
--     rows) stays as the reference: the engine calls it where it has no ring (several
--     sessions stepped together, tensor-parallel backends), and the tests run it to check
--     that the ring keeps, attends and generates the same.
-- All KV heads keep the same rows. Reports "compressed" (whether the prefill evicted rows).
-- Work per event: O(budget) index building in native code; none per ring decode step.
--
-- Parameters (defaults):
--   budget  = 2048   KV rows kept per layer (> sinks)
--   sinks   = 4      leading rows always kept (>= 0)
--   rolling = false  evict during decode too, so the cache never exceeds budget
--
-- Differences from the reference (tools/policy_ref.py StreamingPolicy, FastKV's baseline):
--   * none in what is kept, attended or generated. The reference applies the prefill
--     retention once per prompt; here it applies at every prefill (a later turn of a chat
--     trims the grown cache again), which is the same for a single prompt.
local ks = require "kvsieve"

local function check_params(p)
  local function int(name, v, lo)
    if math.type(v) ~= "integer" then
      error(string.format("parameter %s must be an integer, got %s", name, tostring(v)), 0)
    end
    if v < lo then error(string.format("parameter %s = %d must be >= %d", name, v, lo), 0) end
  end
  int("sinks", p.sinks, 0)
  int("budget", p.budget, 1)
  if p.budget <= p.sinks then
    error(string.format("parameter budget = %d must exceed sinks = %d (room for at least one recent row)",
      p.budget, p.sinks), 0)
  end
  if type(p.rolling) ~= "boolean" then error("parameter rolling must be true or false", 0) end
end

-- The rows to keep out of `rows` (ascending, by position): 0..sinks-1 and the last budget-sinks.
local function keep_rows(rows, p)
  return ks.concat(ks.arange(0, p.sinks), ks.arange(rows - (p.budget - p.sinks), rows))
end

return {
  name = "streamingllm",
  description = "attention sinks + recent window (KV retention only, every layer)",
  paper = "Xiao et al., Efficient Streaming Language Models with Attention Sinks, arXiv:2309.17453",
  params = { budget = 2048, sinks = 4, rolling = false },

  _keep_rows = keep_rows,
  _check_params = check_params,

  begin = function(p)
    check_params(p)
    -- without rolling, decode steps have nothing to do: no handler, so they stay graph-replayable
    if not p.rolling then ks.unhook("decode_qkv") else ks.kv_ring{ sinks = p.sinks, budget = p.budget } end
  end,

  prefill_qkv = function(ev, p)
    local rows = ev.kv_rows[1] + ev.n -- the layer's rows once this prefill's are appended
    if ev.layer == 0 then ev:report("compressed", rows > p.budget) end
    if rows > p.budget then ev:retain(keep_rows(rows, p)) end
  end,

  decode_qkv = function(ev, p)
    if not p.rolling then return end
    local rows = ev.kv_rows[1] -- includes the row this step appended
    if rows > p.budget then
      local keep = keep_rows(rows, p)
      ev:attend(keep)
      ev:retain(keep)
    end
  end,
}
