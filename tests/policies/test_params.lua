-- test_params.lua — a policy for tests only: parameters of every type, reported back as
-- "<name>" = value and "<name>_type" = Lua type at prefill_end.
return {
  name = "test_params",
  params = { k = 64, ratio = 0.5, on = true, mode = "avg", list = { 1, 2 } },
  prefill_end = function(ev, p)
    for _, name in ipairs { "k", "ratio", "on", "mode" } do
      ev:report(name, p[name])
      ev:report(name .. "_type", math.type(p[name]) or type(p[name]))
    end
    ev:report("list_len", #p.list)
  end,
}
