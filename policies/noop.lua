-- noop.lua — a policy that handles every event and does nothing: it measures what the event
-- machinery costs (`kvsieve bench --policy none,noop`). It must generate exactly what full
-- attention generates.
return {
  name = "noop",
  description = "handles every event, changes nothing (overhead measurement)",
  params = {},
  begin = function(p) end,
  prefill_qkv = function(ev, p) end,
  prefill_layer_end = function(ev, p) end,
  prefill_end = function(ev, p) end,
  decode_qkv = function(ev, p) end,
  token = function(ev, p) end,
}
