-- test_events.lua — a policy for tests only: checks what every event carries (shapes,
-- positions, ids) and reports how often each event fired (ev:report).
local ks = require "kvsieve"
local counts

local function bump(ev, what)
  counts[what] = (counts[what] or 0) + 1
  ev:report(what, counts[what])
end

local function check(cond, fmt, ...)
  if not cond then error(string.format(fmt, ...), 2) end
end

return {
  name = "test_events",
  params = { check_values = true },

  begin = function(p)
    counts = {}
    ks.report("begin", true)
  end,

  prefill_qkv = function(ev, p)
    bump(ev, "prefill_qkv")
    local q, k, v = ev.q, ev.k, ev.v
    check(q.shape[1] == ev.n and q.shape[2] == ev.n_heads and q.shape[3] == ev.head_dim, "q shape %s", tostring(q))
    check(k.shape[1] == ev.n and k.shape[2] == ev.n_kv_heads, "k shape %s", tostring(k))
    check(v.shape[1] == ev.n and v.dtype == "f32" and v.device == "cpu", "v %s", tostring(v))
    check(#ev.pos == ev.n and ev.pos.dtype == "i32", "pos")
    if p.check_values then
      local pos, orig = ev.pos:tolist(), ev.orig:tolist()
      for i = 1, ev.n do check(pos[i] == i - 1 and orig[i] == i - 1, "pos/orig at %d", i) end
      check(ev.ids:item(0) == ev.ids:tolist()[1], "ids")
    end
    check(ev.layer >= 0 and ev.layer < ev.n_layers, "layer %d", ev.layer)
    check(ev.event == "prefill_qkv", "event name")
  end,

  prefill_layer_end = function(ev, p)
    bump(ev, "prefill_layer_end")
    local h = ev.hidden
    check(h.shape[1] == ev.n and h.shape[2] == ev.dim, "hidden %s", tostring(h))
    local rows = ev.kv_rows
    check(#rows == ev.n_kv_heads and rows[1] == ev.n, "kv rows %d", rows[1])
    check(#ev:kv_pos(0) == ev.n, "kv_pos")
    local kk = ev:kv_keys()
    check(kk.shape[1] == ev.n and kk.shape[2] == ev.n_kv_heads, "kv_keys %s", tostring(kk))
  end,

  prefill_end = function(ev, p)
    bump(ev, "prefill_end")
    ev:report("prefill_end_n", ev.n)
    check(ev.layer == -1, "prefill_end layer %d", ev.layer)
  end,

  decode_qkv = function(ev, p)
    bump(ev, "decode_qkv")
    check(ev.n == 1 and ev.q.shape[1] == 1, "decode n")
    local pos = ev.pos:item()
    check(ev.kv_rows[1] == pos + 1, "decode rows %d at pos %d", ev.kv_rows[1], pos)
    local kp = ev:kv_pos(ev.n_kv_heads - 1)
    check(kp:item(pos) == pos, "kv_pos of the new row")
    -- the row just appended is the key of this step
    local K = ev:kv_keys()
    local a, b = K:row(pos):tolist(), ev.k:row(0):tolist()
    for hh = 1, #a do for d = 1, #a[hh] do check(a[hh][d] == b[hh][d], "kv_keys row") end end
  end,

  token = function(ev, p)
    bump(ev, "token")
    ev:report("last_token", ev.token)
  end,
}
