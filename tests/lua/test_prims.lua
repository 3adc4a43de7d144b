-- test_prims.lua — the Lua binding of every primitive against plain reference loops
-- written here (the C implementations are checked separately in C). Run by tests/test_lua.c
-- (or `kvsieve run tests/lua/test_prims.lua`). Everything is 0-based on the Lua side except
-- Lua tables (1-based sequences).
local ks = require "kvsieve"

-- ---------------------------------------------------------------- helpers

local seed = 12345
local function rnd() -- deterministic uniform in [-1, 1), never exactly 0
  seed = (seed * 1103515245 + 12345) % 2147483648
  local u = seed / 2147483648 * 2 - 1
  return u == 0 and 0.01 or u
end

local function rand_list(n) local t = {} for i = 1, n do t[i] = rnd() end return t end
local function rand_nd(shape, d)
  d = d or 1
  if d == #shape then return rand_list(shape[d]) end
  local t = {}
  for i = 1, shape[d] do t[i] = rand_nd(shape, d + 1) end
  return t
end

local function close(a, b, tol)
  tol = tol or 1e-4
  return math.abs(a - b) <= tol * math.max(1, math.abs(a), math.abs(b))
end

local function check_close(got, want, what, tol)
  if type(want) == "number" then
    assert(close(got, want, tol), string.format("%s: got %.9g want %.9g", what, got, want))
    return
  end
  assert(#got == #want, string.format("%s: length %d vs %d", what, #got, #want))
  for i = 1, #want do check_close(got[i], want[i], what .. "[" .. i .. "]", tol) end
end

local function check_eq(got, want, what)
  assert(#got == #want, string.format("%s: length %d vs %d", what, #got, #want))
  for i = 1, #want do
    assert(got[i] == want[i], string.format("%s[%d]: got %s want %s", what, i, tostring(got[i]), tostring(want[i])))
  end
end

local function expect_error(pattern, f, ...)
  local ok, e = pcall(f, ...)
  assert(not ok, "expected an error matching '" .. pattern .. "'")
  assert(tostring(e):find(pattern, 1, true), string.format("error '%s' lacks '%s'", tostring(e), pattern))
end

-- ---------------------------------------------------------------- tensors

do
  local t = ks.tensor({ { 1.5, 2, 3 }, { 4, 5, 6 } })
  assert(t.dtype == "f32" and t.device == "cpu" and t.ndim == 2 and #t == 2 and t:numel() == 6)
  check_eq(t.shape, { 2, 3 }, "shape")
  check_close(t:tolist()[1], { 1.5, 2, 3 }, "tolist")
  assert(t:item(1, 2) == 6 and t:item(-1, -1) == 6)
  local i = ks.tensor({ 3, 1, 2 })
  assert(i.dtype == "i32" and math.type(i:tolist()[1]) == "integer")
  assert(ks.tensor({ 7 }):item() == 7)
  assert(tostring(t):find("tensor(f32, [2, 3])", 1, true), tostring(t))
  -- views: slice / row share memory with their tensor
  local s = t:slice(1, 1, 3)
  check_eq(s.shape, { 2, 2 }, "slice shape")
  check_close(s:tolist()[2], { 5, 6 }, "slice")
  check_close(t:row(1):tolist(), { 4, 5, 6 }, "row")
  check_close(t:slice(0, -1):tolist()[1], { 4, 5, 6 }, "negative slice")
  check_eq(t:reshape(3, 2).shape, { 3, 2 }, "reshape")
  check_eq(t:reshape(-1).shape, { 6 }, "reshape -1")
  check_close(s:reshape(4):tolist(), { 2, 3, 5, 6 }, "reshape of a strided view copies")
  check_close(s:clone():tolist()[1], { 2, 3 }, "clone")
  check_eq(t:int():tolist()[1], { 1, 2, 3 }, "int truncates")
  assert(i:float().dtype == "f32")
  check_close(((t + 1) * 2):tolist()[1], { 5, 6, 8 }, "arith")
  check_close((t / t):tolist()[2], { 1, 1, 1 }, "div")
  check_close((-t):tolist()[1], { -1.5, -2, -3 }, "unm")
  assert((i + i).dtype == "i32" and (i / 2).dtype == "f32")
  check_eq(ks.zeros({ 2, 2 }, "i32"):tolist()[2], { 0, 0 }, "zeros")
  check_eq(ks.stack({ i, i }).shape, { 2, 3 }, "stack")
  assert(ks.tensor(2.5).ndim == 0 and ks.tensor(2.5):item() == 2.5)
  expect_error("item: tensor has 6 elements", function() return t:item() end)
  expect_error("slice: range [2, 9)", function() return t:slice(1, 2, 9) end)
  expect_error("read-only", function() t.x = 1 end)
  expect_error("0-based", function() return t[1] end)
  expect_error("ragged table", function() return ks.tensor({ { 1, 2 }, { 3 } }) end)
  expect_error("not a number", function() return ks.tensor({ 1, "x" }) end)
  expect_error("no field or method 'shap'", function() return t.shap end)
  do
    local c <close> = ks.tensor({ 1, 2 })
  end
  local c = ks.tensor({ 1, 2 })
  getmetatable(c) -- protected: returns the name, not the table
  assert(getmetatable(c) == "kvsieve.tensor")
end

-- ---------------------------------------------------------------- scores

-- q (m, H, d), k (n, Hkv, d) as nested tables; returns rows[h or kv][j] per the options
local function ref_scores(q, k, o)
  local m, H, d = #q, #q[1], #q[1][1]
  local n, Hkv = #k, #k[1]
  local g = H // Hkv
  local r0, r1 = 0, m -- selected rows [r0, r1)
  if o.rows == "last" then r0 = m - 1 elseif type(o.rows) == "number" then r0 = m - o.rows
  elseif type(o.rows) == "table" then r0, r1 = o.rows[1], o.rows[2] end
  local mq = r1 - r0
  local kb, ke = 0, n
  if o.key_range then kb, ke = o.key_range[1], o.key_range[2] end
  local ob, oe = 0, n
  if o.out then ob, oe = o.out[1], o.out[2] end
  local scale = 1 / math.sqrt(d)
  if o.scale == "none" then scale = 1 elseif type(o.scale) == "number" then scale = o.scale end
  local per = {}
  for h = 0, H - 1 do
    local kv = o.gqa == "mod" and h % Hkv or h // g
    local acc = {}
    for j = 0, n - 1 do acc[j] = 0 end
    for i = 0, mq - 1 do
      local row = r0 + i
      local qp
      if o.rows and type(o.rows) == "table" then qp = row else qp = n - mq + i end
      local l, vis = {}, {}
      local mx = -math.huge
      for j = kb, ke - 1 do
        if not o.causal or j <= qp then
          local s = 0
          for c = 1, d do s = s + q[row + 1][h + 1][c] * k[j + 1][kv + 1][c] end
          l[j] = s * scale
          vis[#vis + 1] = j
          if l[j] > mx then mx = l[j] end
        end
      end
      if o.softmax then
        local den = 0
        for _, j in ipairs(vis) do den = den + math.exp(l[j] - mx) end
        for _, j in ipairs(vis) do acc[j] = acc[j] + math.exp(l[j] - mx) / den end
      else
        for _, j in ipairs(vis) do acc[j] = acc[j] + l[j] end
      end
    end
    per[h] = acc
  end
  local function cols(acc) local t = {} for j = ob, oe - 1 do t[#t + 1] = acc[j] end return t end
  local red = o.reduce or "none"
  if red == "none" then
    local out = {}
    for h = 0, H - 1 do out[h + 1] = cols(per[h]) end
    return out
  elseif red == "group" then
    local out = {}
    for kv = 0, Hkv - 1 do
      local acc = {}
      for j = 0, n - 1 do acc[j] = 0 end
      for h = 0, H - 1 do
        if (o.gqa == "mod" and h % Hkv or h // g) == kv then
          for j = 0, n - 1 do acc[j] = acc[j] + per[h][j] end
        end
      end
      out[kv + 1] = cols(acc)
    end
    return out
  else
    local acc = {}
    for j = 0, n - 1 do acc[j] = 0 end
    for h = 0, H - 1 do for j = 0, n - 1 do acc[j] = acc[j] + per[h][j] end end
    if red == "mean" then for j = 0, n - 1 do acc[j] = acc[j] / H end end
    return cols(acc)
  end
end

do
  local n, H, Hkv, d = 12, 4, 2, 8
  local qt, kt = rand_nd({ n, H, d }), rand_nd({ n, Hkv, d })
  local q, k = ks.tensor(qt, "f32"), ks.tensor(kt, "f32")
  local cases = {
    { rows = 4, causal = true, softmax = true, reduce = "group", out = { 0, n - 4 } }, -- SnapKV
    { rows = "last", scale = "none", reduce = "sum" },                                 -- GemFilter
    { reduce = "none", causal = true, rows = { 2, 5 } },
    { reduce = "mean", softmax = true, key_range = { 3, 10 }, out = { 3, 10 } },
    { reduce = "sum", softmax = true, gqa = "mod", scale = 0.5, rows = 3 },
    { reduce = "group", rows = 1, causal = true, softmax = true },
  }
  for ci, o in ipairs(cases) do
    local got = ks.scores(q, k, o):tolist()
    check_close(got, ref_scores(qt, kt, o), "scores case " .. ci, 1e-4)
  end
  -- a 2-d query (one fingerprint) over a key range, TokenSelect-style
  local fp = rand_nd({ H, d })
  local got = ks.scores(ks.tensor(fp, "f32"), k, { scale = "none", softmax = true, key_range = { 2, 9 }, out = { 2, 9 }, reduce = "sum" })
  check_close(got:tolist(), ref_scores({ fp }, kt, { scale = "none", softmax = true, key_range = { 2, 9 }, out = { 2, 9 }, reduce = "sum", rows = 1 }), "fingerprint")
  -- strided q: the last rows of a slice
  local qs = q:slice(0, 4, 12)
  check_close(ks.scores(qs, k, { rows = 2, causal = true, reduce = "sum" }):tolist(),
    ref_scores(qt, kt, { rows = 2, causal = true, reduce = "sum" }), "sliced q")
  expect_error("scores: unknown option 'row'", function() return ks.scores(q, k, { row = 1 }) end)
  expect_error("scores: option reduce", function() return ks.scores(q, k, { reduce = "max" }) end)
  expect_error("head_dim of q", function() return ks.scores(q, ks.zeros({ n, Hkv, 4 })) end)
  expect_error("scores: argument 2: tensor expected", function() return ks.scores(q, {}) end)
end

-- ---------------------------------------------------------------- pooling and ordering

local function ref_pool(x, kernel, mode)
  local n, half, out = #x, kernel // 2, {}
  for i = 1, n do
    local acc = mode == "max" and -math.huge or 0
    for t = i - half, i + half do
      local v = x[t]
      if mode == "max" then if v and v > acc then acc = v end
      else acc = acc + (v or 0) end
    end
    out[i] = mode == "max" and acc or acc / kernel
  end
  return out
end

do
  local x = rand_list(23)
  for _, kernel in ipairs { 1, 3, 5, 7, 31 } do
    for _, mode in ipairs { "avg", "max" } do
      check_close(ks.pool1d(ks.tensor(x, "f32"), kernel, mode):tolist(), ref_pool(x, kernel, mode), "pool1d " .. mode .. kernel)
    end
  end
  local x2 = { rand_list(9), rand_list(9) }
  local p2 = ks.pool1d(ks.tensor(x2, "f32"), 3, "max"):tolist()
  check_close(p2[2], ref_pool(x2[2], 3, "max"), "pool1d rows")
  expect_error("pool1d: mode must be", function() return ks.pool1d(ks.tensor(x, "f32"), 3, "min") end)
  expect_error("pool1d", function() return ks.pool1d(ks.tensor(x, "f32"), 4) end) -- even kernel

  -- topk: the k largest, ties to the lower index
  local v = { 0.5, 0.9, 0.1, 0.9, 0.3, 0.5, 0.7 }
  local idx, vals = ks.topk(ks.tensor(v, "f32"), 4)
  check_eq(idx:tolist(), { 0, 1, 3, 6 }, "topk by index") -- 0.9, 0.9, 0.7, then 0.5 at 0 and 5: the lower index wins
  local idv = ks.topk(ks.tensor(v, "f32"), 4, { sorted = "value" })
  check_eq(idv:tolist(), { 1, 3, 6, 0 }, "topk by value")
  check_close(vals:tolist(), { 0.5, 0.9, 0.9, 0.7 }, "topk values (index order)")
  -- values = false: the same indices, and nothing else returned
  local nres = select("#", ks.topk(ks.tensor(v, "f32"), 4, { values = false }))
  assert(nres == 1, "topk values = false returns the indices alone, got " .. nres .. " results")
  check_eq(ks.topk(ks.tensor(v, "f32"), 4, { values = false }):tolist(), { 0, 1, 3, 6 }, "topk values = false")
  check_eq(ks.topk(ks.tensor(v, "f32"), 4, { sorted = "value", values = false }):tolist(), { 1, 3, 6, 0 },
    "topk by value, values = false")
  expect_error("topk: option values must be a boolean, got number", function() return ks.topk(ks.tensor(v, "f32"), 4, { values = 0 }) end)
  -- base: every index shifted by it, the values unchanged
  local ib, vb = ks.topk(ks.tensor(v, "f32"), 4, { base = 100 })
  check_eq(ib:tolist(), { 100, 101, 103, 106 }, "topk base")
  check_close(vb:tolist(), { 0.5, 0.9, 0.9, 0.7 }, "topk base values")
  check_eq(ks.topk(ks.tensor(v, "f32"), 4, { sorted = "value", values = false, base = 7 }):tolist(), { 8, 10, 13, 7 },
    "topk by value, base")
  expect_error("topk: option base must be an integer, got number", function() return ks.topk(ks.tensor(v, "f32"), 4, { base = 1.5 }) end)
  expect_error("topk: base -1 + n 7 leaves the int32 index range", function() return ks.topk(ks.tensor(v, "f32"), 4, { base = -1 }) end)
  local x3 = rand_list(50)
  local order = {}
  for i = 1, #x3 do order[i] = i - 1 end
  table.sort(order, function(a, b) if x3[a + 1] ~= x3[b + 1] then return x3[a + 1] > x3[b + 1] end return a < b end)
  local want = {}
  for i = 1, 10 do want[i] = order[i] end
  table.sort(want)
  check_eq(ks.topk(ks.tensor(x3, "f32"), 10):tolist(), want, "topk random")
  check_eq(ks.topk(ks.tensor({ x3, x3 }, "f32"), 10):tolist()[2], want, "topk rows")
  expect_error("topk: k = 60 > n = 50", function() return ks.topk(ks.tensor(x3, "f32"), 60) end)

  -- sort, argsort, rank
  local sorted = {}
  for i, a in ipairs(x3) do sorted[i] = a end
  table.sort(sorted)
  check_close(ks.sort(ks.tensor(x3, "f32")):tolist(), sorted, "sort")
  check_eq(ks.sort({ 5, 1, 3 }):tolist(), { 1, 3, 5 }, "sort ints")
  check_eq(ks.sort({ 5, 1, 3 }, { descending = true }):tolist(), { 5, 3, 1 }, "sort ints desc")
  check_eq(ks.argsort(ks.tensor({ 0.3, 0.1, 0.2 }, "f32")):tolist(), { 1, 2, 0 }, "argsort")
  check_eq(ks.argsort(ks.tensor({ 0.3, 0.1, 0.3 }, "f32"), { descending = true }):tolist(), { 0, 2, 1 }, "argsort desc stable")
  local rk = ks.rank(ks.tensor(x3, "f32")):tolist()
  for pos, j in ipairs(order) do assert(rk[j + 1] == pos, "rank of " .. j) end
  check_eq(ks.rank(ks.tensor({ 0.5, 0.5, 0.9 }, "f32")):tolist(), { 2, 3, 1 }, "rank ties")
end

-- ---------------------------------------------------------------- index lists and numerics

do
  check_eq(ks.unique({ 5, 1, 5, 3, 1 }):tolist(), { 1, 3, 5 }, "unique")
  check_eq(ks.union({ 1, 4, 9 }, { 2, 4, 10 }):tolist(), { 1, 2, 4, 9, 10 }, "union")
  check_eq(ks.union({ 9, 1 }, { 4, 1 }):tolist(), { 1, 4, 9 }, "union unsorted")
  check_eq(ks.concat({ 1, 2 }, ks.tensor({ 3 }), { 4, 5 }):tolist(), { 1, 2, 3, 4, 5 }, "concat")
  assert(ks.concat({ 1 }, ks.tensor({ 0.5 }, "f32")).dtype == "f32", "concat promotes")
  check_eq(ks.arange(4):tolist(), { 0, 1, 2, 3 }, "arange(n)")
  check_eq(ks.arange(2, 9, 3):tolist(), { 2, 5, 8 }, "arange step")
  check_eq(ks.arange(5, 1, -2):tolist(), { 5, 3 }, "arange down")
  expect_error("arange: step must not be 0", function() return ks.arange(0, 3, 0) end)
  local x = ks.tensor({ { 1, 2 }, { 3, 4 }, { 5, 6 } }, "f32")
  check_close(ks.gather(x, { 2, 0, 2 }):tolist()[1], { 5, 6 }, "gather rows")
  check_eq(ks.gather(ks.tensor({ 10, 20, 30 }), { 1, 1 }):tolist(), { 20, 20 }, "gather i32")
  check_eq(ks.gather(ks.tensor({ { 1, 2 }, { 3, 4 } }), { 1 }):tolist()[1], { 3, 4 }, "gather i32 rows")
  expect_error("gather: index 3", function() return ks.gather(x, { 3 }) end)

  local v = rand_list(17)
  local mx, den = -math.huge, 0
  for _, a in ipairs(v) do mx = math.max(mx, a) end
  for _, a in ipairs(v) do den = den + math.exp(a - mx) end
  local sm = {}
  for i, a in ipairs(v) do sm[i] = math.exp(a - mx) / den end
  check_close(ks.softmax(ks.tensor(v, "f32")):tolist(), sm, "softmax")

  local m = { rand_list(5), rand_list(5), rand_list(5) }
  local t = ks.tensor(m, "f32")
  local tot, c0, r0 = 0, {}, {}
  for i = 1, 3 do r0[i] = 0 end
  for j = 1, 5 do c0[j] = 0 end
  for i = 1, 3 do for j = 1, 5 do tot = tot + m[i][j]; c0[j] = c0[j] + m[i][j]; r0[i] = r0[i] + m[i][j] end end
  check_close(ks.sum(t), tot, "sum all")
  check_close(ks.sum(t, 0):tolist(), c0, "sum axis 0")
  check_close(ks.sum(t, 1):tolist(), r0, "sum axis 1")
  check_close(ks.sum(t, -1):tolist(), r0, "sum axis -1")
  local mean0 = {}
  for j = 1, 5 do mean0[j] = c0[j] / 3 end
  check_close(ks.mean(t, 0):tolist(), mean0, "mean axis 0")
  check_close(ks.mean(t), tot / 15, "mean all")
  local var0 = {}
  for j = 1, 5 do
    local s = 0
    for i = 1, 3 do s = s + (m[i][j] - mean0[j]) ^ 2 end
    var0[j] = s / 3
  end
  check_close(ks.var(t, 0):tolist(), var0, "var axis 0")
  local var1 = {}
  for j = 1, 5 do var1[j] = var0[j] * 3 / 2 end
  check_close(ks.var(t, 0, { ddof = 1 }):tolist(), var1, "var ddof 1")
  local t3 = ks.tensor({ m, m }, "f32")
  check_close(ks.sum(t3, 1):tolist()[2], c0, "sum of 3-d over axis 1")
  check_close(ks.sum(ks.tensor({ 1, 2, 3 })), 6, "sum of ints")
  expect_error("var: unknown option 'dof'", function() return ks.var(t, 0, { dof = 1 }) end)
  expect_error("sum: axis 2 out of range", function() return ks.sum(t, 2) end)

  local a, b = rand_list(8), rand_list(8)
  local dot, na, nb = 0, 0, 0
  for i = 1, 8 do dot = dot + a[i] * b[i]; na = na + a[i] ^ 2; nb = nb + b[i] ^ 2 end
  check_close(ks.cosine(ks.tensor(a, "f32"), ks.tensor(b, "f32")), dot / math.sqrt(na * nb), "cosine")
  local cr = ks.cosine(ks.tensor({ a, b }, "f32"), ks.tensor({ a, a }, "f32")):tolist()
  check_close(cr, { 1, dot / math.sqrt(na * nb) }, "cosine rows")
  expect_error("cosine: a and b differ in shape", function() return ks.cosine(ks.tensor(a, "f32"), ks.tensor({ 1 }, "f32")) end)
end

-- ---------------------------------------------------------------- masks: ge, where, scores' skip

do
  local x = ks.tensor({ 0.5, -1, 2, 0.25 }, "f32")
  local g = ks.ge(x, 0.5)
  assert(g.dtype == "f32")
  check_eq(g:tolist(), { 1, 0, 1, 0 }, "ge")
  -- the float widened to double, as Lua compares it: 0.1f >= 0.1 holds, >= 0.10000001 does not
  local tenth = ks.tensor({ 0.1 }, "f32")
  assert(ks.ge(tenth, 0.1):item(0) == 1 and (tenth:item(0) >= 0.1))
  assert(ks.ge(tenth, 0.10000001):item(0) == 0 and not (tenth:item(0) >= 0.10000001))
  check_eq(ks.ge({ { 1, 2 }, { 3, 4 } }, 2.5).shape, { 2, 2 }, "ge keeps the shape")
  expect_error("ge: v must be a number, got string", function() return ks.ge(x, "1") end)
  local a, b = ks.tensor({ 1, 5, 9 }), ks.tensor({ 2, 6, 7 })
  check_eq(ks.where(ks.tensor({ 1 }, "f32"), a, b):tolist(), { 1, 5, 9 }, "where 1")
  check_eq(ks.where(ks.tensor({ 0 }, "f32"), a, b):tolist(), { 2, 6, 7 }, "where 0")
  check_eq(ks.where({ 1, 0, 1 }, a, b):tolist(), { 1, 6, 9 }, "where per element")
  check_eq(ks.where(ks.ge(x, 0), x, -x):tolist(), { 0.5, 1, 2, 0.25 }, "where of floats")
  expect_error("where: a and b must be two f32 or two i32 tensors", function() return ks.where({ 1 }, a, x:slice(0, 0, 3)) end)
  expect_error("where: a and b differ in shape", function() return ks.where({ 1 }, a, ks.tensor({ 1, 2 })) end)
  expect_error("where: the mask has 2 values for 3 elements (want 1 or 3)", function() return ks.where({ 1, 0 }, a, b) end)
  -- a list valid by construction stays so under one mask value (ev:attend then checks bounds only)
  local sel = ks.where(ks.tensor({ 0 }, "f32"), ks.topk(ks.tensor({ 3, 1, 2 }, "f32"), 2), ks.arange(4, 6))
  check_eq(sel:tolist(), { 4, 5 }, "where of two lists")
  -- scores skipped by a mask: zeros and no key read (NaN keys leave no trace); a zero mask changes nothing
  local q, k = ks.tensor({ { 1, 0 }, { 0, 1 } }, "f32"), ks.tensor({ { { 1, 2 } }, { { 3, 4 } }, { { 0 / 0, 1 } } }, "f32")
  local o = { scale = "none", reduce = "sum", out = { 0, 2 } }
  local want = ks.scores(q, k, o):tolist()
  o.skip = ks.tensor({ 0 }, "f32")
  check_eq(ks.scores(q, k, o):tolist(), want, "scores under a zero mask")
  o.skip = ks.ge(ks.tensor({ 1 }, "f32"), 1)
  check_eq(ks.scores(q, k, o):tolist(), { 0, 0 }, "skipped scores")
  o.skip = ks.tensor({ 1, 1 }, "f32")
  expect_error("scores: option skip: a mask of one value (ks.ge's), got 2 values", function() return ks.scores(q, k, o) end)
  o.skip = "yes"
  expect_error("scores", function() return ks.scores(q, k, o) end)
  -- top-k skipped: the top k of zeros (the first k rows from base), values 0, still a valid list
  local v = ks.tensor({ 0 / 0, 3, 1, 2 }, "f32")
  local i1, v1 = ks.topk(v, 2, { base = 7, skip = ks.tensor({ 1 }, "f32") })
  check_eq(i1:tolist(), { 7, 8 }, "skipped topk"); check_eq(v1:tolist(), { 0, 0 }, "skipped topk values")
  check_eq(ks.topk(v, 2, { skip = ks.tensor({ 0 }, "f32") }):tolist(), ks.topk(v, 2):tolist(), "topk under a zero mask")
  expect_error("topk: option skip: a mask of one value (ks.ge's), got 2 values", function() return ks.topk(v, 2, { skip = { 1, 1 } }) end)
end

-- ---------------------------------------------------------------- in place: where's and add's into

do
  local a, b = ks.tensor({ 1, 5, 9 }), ks.tensor({ 2, 6, 7 })
  local t = a:clone()
  assert(ks.where({ 0, 1, 0 }, t, b, { into = t }) == t, "where into returns the tensor written")
  check_eq(t:tolist(), { 2, 5, 7 }, "where into (per element, t as a)")
  ks.where({ 1 }, a, t, { into = t })
  check_eq(t:tolist(), { 1, 5, 9 }, "where into (t as b)")
  -- a view of the written tensor reads what was written, strided or not
  local f = ks.tensor({ { 1, 2 }, { 3, 4 } }, "f32")
  local col = f:slice(1, 1, 2)
  local c0 = col:tolist()
  assert(c0[1][1] == 2 and c0[2][1] == 4, "a strided view before")
  ks.add(f, { { 10, 10 }, { 10, 10 } }, { into = f })
  local c1 = col:tolist()
  assert(c1[1][1] == 12 and c1[2][1] == 14, "the strided view after add into: " .. c1[1][1] .. ", " .. c1[2][1])
  check_eq(ks.add({ 0.1 }, { 0.2 }):tolist(), (ks.tensor({ 0.1 }, "f32") + ks.tensor({ 0.2 }, "f32")):tolist(), "add == a + b")
  local n = ks.tensor({ 0 }, "f32")
  for _ = 1, 5 do ks.add(n, ks.ge({ 0.95 }, 0.9), { into = n }) end
  assert(n:item(0) == 5, "a counter kept in place: " .. n:item(0))
  -- a list valid by construction: one mask value keeps the union of both ranges
  local l = ks.topk(ks.tensor({ 3, 1, 2 }, "f32"), 2)
  ks.where({ 0 }, l, ks.arange(4, 6), { into = l })
  check_eq(l:tolist(), { 4, 5 }, "a list written in place")
  expect_error("where: option into must own its memory", function() return ks.where({ 1 }, a, b, { into = a:slice(0, 0, 3) }) end)
  expect_error("add: option into must own its memory", function() return ks.add(f, f, { into = f:reshape(-1):reshape(2, 2) }) end)
  expect_error("where: option into holds 4 f32 elements; the result is 3 i32 elements", function() return ks.where({ 1 }, a, b, { into = f }) end)
  expect_error("add: option into holds 3 i32 elements; the result is 4 f32 elements", function() return ks.add(f, f, { into = a }) end)
  expect_error("where: option into must be a tensor, got number", function() return ks.where({ 1 }, a, b, { into = 5 }) end)
  expect_error("add: unknown option 'onto' (options: into)", function() return ks.add(f, f, { onto = f }) end)
  expect_error("add: a and b differ in shape", function() return ks.add({ 1, 2 }, { 1 }) end)
  local closed
  do local c <close> = a:clone(); closed = c end
  expect_error("where: option into: tensor used after it was closed", function() return ks.where({ 1 }, a, b, { into = closed }) end)
end

return "ok"
