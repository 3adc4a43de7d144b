-- prelude.lua — Lua-side helpers of the kvsieve module, compiled into the binary
-- (lua/prelude_blob.c) and run when the module opens: views for people in the REPL.
--
--   ks.show_kept(r, m [, {layer=, head=, color=}])  the prompt with kept tokens highlighted
--   ks.kept_table(r)            kept rows per layer and KV head
--   ks.occupancy(r)             KV occupancy (kept / total) per layer and head, with bars
--   ks.timings(r)               prefill / decode timings as one line
--   ks.sparkline(values [, width])  a text sparkline (▁▂▃▄▅▆▇█) of numbers or a 1-d tensor
--   ks.pieces(m, ids)           display text of each token
-- Results print as a short summary (tostring(r)).
local ks, result_mt = ...

local concat, fmt, rep = table.concat, string.format, string.rep

local function tty() return ks._isatty and ks._isatty(1) end

-- Display text of a token: SentencePiece "▁" and byte-level "Ġ"/"Ċ" as spaces / newlines.
local function piece_text(m, id)
  local s = m:token_str(id)
  if not s then return fmt("<%d>", id) end
  local byte = s:match("^<0x(%x%x)>$")
  if byte then
    local b = tonumber(byte, 16)
    return b < 128 and string.char(b) or "?"
  end
  s = s:gsub("\u{2581}", " "):gsub("\u{0120}", " "):gsub("\u{010A}", "\n")
  return s
end

function ks.pieces(m, ids)
  local out = {}
  for i, id in ipairs(ids) do out[i] = piece_text(m, id) end
  return out
end

local function as_list(values)
  if type(values) == "table" then return values end
  return values:tolist()
end

function ks.sparkline(values, width)
  local v = as_list(values)
  local n = #v
  if n == 0 then return "" end
  width = width or math.min(n, 80)
  local bars = { "▁", "▂", "▃", "▄", "▅", "▆", "▇", "█" }
  -- bucket maximum, so isolated peaks survive downsampling
  local b = {}
  for i = 1, width do
    local lo = math.floor((i - 1) * n / width) + 1
    local hi = math.max(lo, math.floor(i * n / width))
    local m = -math.huge
    for j = lo, hi do if v[j] > m then m = v[j] end end
    b[i] = m
  end
  local lo, hi = math.huge, -math.huge
  for _, x in ipairs(b) do
    if x == x then lo, hi = math.min(lo, x), math.max(hi, x) end
  end
  local out = {}
  for i, x in ipairs(b) do
    local k = 1
    if x ~= x then k = 1
    elseif hi > lo then k = math.floor((x - lo) / (hi - lo) * 7 + 0.5) + 1 end
    out[i] = bars[k]
  end
  return concat(out)
end

-- The prompt positions kept at a layer: a set {pos = true}.
local function kept_set(r, layer, head)
  local set = {}
  if r.restart then
    for _, i in ipairs(r.restart) do set[i] = true end
    return set
  end
  local heads = head and { head } or {}
  if not head then for h = 0, r.n_kv_heads - 1 do heads[#heads + 1] = h end end
  for _, h in ipairs(heads) do
    for _, p in ipairs(r.kept(layer, h)) do set[p] = true end
  end
  return set
end

function ks.show_kept(r, m, opts)
  opts = opts or {}
  local layer = opts.layer or r.selection_layer or (r.n_layers - 1)
  local set = kept_set(r, layer, opts.head)
  local color = opts.color
  if color == nil then color = tty() end
  local ids = r.prompt_ids
  local out, nk = {}, 0
  for i, id in ipairs(ids) do
    local s = piece_text(m, id)
    if set[i - 1] then
      nk = nk + 1
      out[#out + 1] = color and ("\27[1;30;42m" .. s .. "\27[0m") or ("[" .. s .. "]")
    else
      out[#out + 1] = color and ("\27[2m" .. s .. "\27[0m") or s
    end
  end
  local what = r.restart and "restart" or fmt("layer %d%s", layer, opts.head and fmt(", head %d", opts.head) or "")
  print(fmt("-- kept %d of %d prompt tokens (%s)", nk, #ids, what))
  print(concat(out))
end

function ks.kept_table(r)
  local H = r.n_kv_heads
  local head = { fmt("%5s", "layer") }
  for h = 0, H - 1 do head[#head + 1] = fmt("%7s", "h" .. h) end
  head[#head + 1] = fmt("%8s", "total")
  local lines = { concat(head) }
  for l = 0, r.n_layers - 1 do
    local row, tot = { fmt("%5d", l) }, 0
    for h = 0, H - 1 do
      local n = #r.kept(l, h)
      tot = tot + n
      row[#row + 1] = fmt("%7d", n)
    end
    row[#row + 1] = fmt("%8d", tot)
    lines[#lines + 1] = concat(row)
  end
  print(concat(lines, "\n"))
end

function ks.occupancy(r)
  local total = r.prompt_tokens + math.max(0, r.n_generated - 1)
  local lines = { fmt("-- KV occupancy: kept rows / %d tokens", total) }
  for l = 0, r.n_layers - 1 do
    local row = { fmt("%5d ", l) }
    for h = 0, r.n_kv_heads - 1 do
      local f = total > 0 and #r.kept(l, h) / total or 0
      local w = math.floor(f * 10 + 0.5)
      row[#row + 1] = fmt(" %s%s %3d%%", rep("█", w), rep("·", 10 - w), math.floor(f * 100 + 0.5))
    end
    lines[#lines + 1] = concat(row)
  end
  print(concat(lines, "\n"))
end

function ks.timings(r)
  local s = fmt("prefill %d tokens in %.3f s (%.1f tok/s) | decode %d tokens in %.3f s (%.1f tok/s)",
    r.prompt_tokens, r.prefill_s, r.prefill_tps, math.max(0, r.n_generated - 1), r.decode_s, r.tps)
  print(s)
end

result_mt.__tostring = function(r)
  local t = r.text
  if #t > 60 then t = t:sub(1, 57) .. "..." end
  return fmt("result(%d prompt + %d generated tokens%s%s%s): %q", r.prompt_tokens, r.n_generated,
    r.policy and (", policy " .. r.policy) or "",
    r.selection_layer and (", selection layer " .. r.selection_layer) or "",
    r.fallback and ", FELL BACK to full attention" or "", t)
end
