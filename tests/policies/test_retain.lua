-- test_retain.lua — a policy for tests only. tests/test_lua.c runs the same policy written
-- in C (struct ks_policy) and checks that both give identical tokens and kept positions.
-- Rows and heads are 0-based.
--   prefill_layer_end at prop_layer (first pass): propagate the even rows and the last row
--   prefill_qkv at layer: KV head h retains rows {0, 2 + h, 5, n - 1} (deduplicated)
--   decode_qkv: KV head h attends to every row except row 1 + h
return {
  name = "test_retain",
  description = "test policy: propagate / per-head retain / per-head attend",
  params = { layer = 1, prop_layer = 0 },

  prefill_layer_end = function(ev, p)
    if ev.layer ~= p.prop_layer or ev.pass ~= 0 then return end
    local idx = {}
    for i = 0, ev.n - 1, 2 do idx[#idx + 1] = i end
    if (ev.n - 1) % 2 == 1 then idx[#idx + 1] = ev.n - 1 end
    ev:propagate(idx)
  end,

  prefill_qkv = function(ev, p)
    if ev.layer ~= p.layer then return end
    local lists = {}
    for h = 0, ev.n_kv_heads - 1 do
      local seen, l = {}, {}
      for _, r in ipairs { 0, math.min(2 + h, ev.n - 1), math.min(5, ev.n - 1), ev.n - 1 } do
        if not seen[r] then seen[r] = true; l[#l + 1] = r end
      end
      lists[h + 1] = l
    end
    ev:retain(lists)
  end,

  decode_qkv = function(ev, p)
    local rows = ev.kv_rows
    local lists = {}
    for h = 0, ev.n_kv_heads - 1 do
      local l = {}
      for r = 0, rows[h + 1] - 1 do
        if r ~= 1 + h then l[#l + 1] = r end
      end
      lists[h + 1] = l
    end
    ev:attend(lists)
  end,
}
