-- json.lua — a small JSON decoder for test fixtures (pure Lua, strict enough for files we
-- generate ourselves). json.decode(text) -> value; arrays are 1-based Lua sequences, null is
-- json.null. json.read(path) reads and decodes a file.
local json = {}
json.null = setmetatable({}, {__tostring = function() return "null" end})

local byte, sub, find, tonumber, char = string.byte, string.sub, string.find, tonumber, utf8.char

local function fail(s, i, what) error(("json: %s at byte %d near %q"):format(what, i, sub(s, i, i + 20)), 0) end

local function skip(s, i)
  local _, e = find(s, "^[ \t\r\n]*", i)
  return e + 1
end

local parse

local function parse_string(s, i)
  local out, j = {}, i + 1
  while true do
    local a, b = find(s, '["\\]', j)
    if not a then fail(s, i, "unterminated string") end
    out[#out + 1] = sub(s, j, a - 1)
    if sub(s, a, a) == '"' then return table.concat(out), a + 1 end
    local c = sub(s, a + 1, a + 1)
    local map = {b = "\b", f = "\f", n = "\n", r = "\r", t = "\t", ['"'] = '"', ["\\"] = "\\", ["/"] = "/"}
    if map[c] then out[#out + 1] = map[c]; j = a + 2
    elseif c == "u" then
      local cp = tonumber(sub(s, a + 2, a + 5), 16) or fail(s, a, "bad \\u escape")
      j = a + 6
      if cp >= 0xD800 and cp <= 0xDBFF and sub(s, j, j + 1) == "\\u" then
        local lo = tonumber(sub(s, j + 2, j + 5), 16)
        if lo and lo >= 0xDC00 and lo <= 0xDFFF then cp = 0x10000 + (cp - 0xD800) * 0x400 + (lo - 0xDC00); j = j + 6 end
      end
      out[#out + 1] = char(cp)
    else fail(s, a, "bad escape") end
  end
end

parse = function(s, i)
  i = skip(s, i)
  local c = byte(s, i)
  if c == 123 then -- {
    local obj = {}
    i = skip(s, i + 1)
    if byte(s, i) == 125 then return obj, i + 1 end
    while true do
      if byte(s, i) ~= 34 then fail(s, i, "expected a key") end
      local k; k, i = parse_string(s, i)
      i = skip(s, i)
      if byte(s, i) ~= 58 then fail(s, i, "expected ':'") end
      obj[k], i = parse(s, i + 1)
      i = skip(s, i)
      local d = byte(s, i)
      if d == 125 then return obj, i + 1 end
      if d ~= 44 then fail(s, i, "expected ',' or '}'") end
      i = skip(s, i + 1)
    end
  elseif c == 91 then -- [
    local arr, n = {}, 0
    i = skip(s, i + 1)
    if byte(s, i) == 93 then return arr, i + 1 end
    while true do
      n = n + 1
      arr[n], i = parse(s, i)
      i = skip(s, i)
      local d = byte(s, i)
      if d == 93 then return arr, i + 1 end
      if d ~= 44 then fail(s, i, "expected ',' or ']'") end
      i = i + 1
    end
  elseif c == 34 then return parse_string(s, i)
  elseif find(s, "^true", i) then return true, i + 4
  elseif find(s, "^false", i) then return false, i + 5
  elseif find(s, "^null", i) then return json.null, i + 4
  else
    local a, b = find(s, "^-?%d+%.?%d*[eE]?[-+]?%d*", i)
    if not a then fail(s, i, "unexpected character") end
    local txt = sub(s, a, b)
    local v = tonumber(txt) or fail(s, i, "bad number")
    if math.type(v) == "float" and not find(txt, "[.eE]") then v = math.tointeger(v) or v end
    return v, b + 1
  end
end

function json.decode(s)
  local v, i = parse(s, 1)
  i = skip(s, i)
  if i <= #s then fail(s, i, "trailing characters") end
  return v
end

function json.read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return json.decode(s)
end

return json
