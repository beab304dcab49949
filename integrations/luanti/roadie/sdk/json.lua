-- JSON (RFC 8259) for the bodies a Roadie engine sends and expects, in pure Lua 5.1 / LuaJIT.
--
--   M.decode(text)            the value, or nil and "<what> at byte <n>"; never raises on bad input
--   M.encode(value)           compact text (no spaces, object keys sorted); raises on a value
--                             JSON cannot hold (NaN, infinities, functions, a key of another type)
--   M.null                    null, apart from an absent key
--   M.array(t), M.object(t)   mark t (and return it; a new table if t is nil) so that [] and {}
--                             stay apart, even empty
--   M.is_array(t), M.is_object(t)
--   M.array_mt, M.object_mt   the marks: metatables
--   M.bigint_mt               the metatable of a big integer: {digits = "18446744073709551615"}
--   M.tostring(v)             a big integer's digits, else tostring(v)
--
-- Decoding: objects and arrays come back marked. An integer of magnitude 2^53 or more (which
-- a double cannot hold exactly) comes back as a big integer, which encode writes back digit for
-- digit and tostring turns into its digits; other numbers come back as Lua numbers ("-0" as 0).
-- A \u escape of a lone UTF-16 surrogate is an error (it names no character), not U+FFFD.
-- Other bytes pass through as they are (UTF-8 is not checked). Nesting deeper than 200 is an
-- error, as is a fraction or exponent beyond the range of a double (1e400).
--
-- Encoding an unmarked table: empty is {}, keys exactly 1..n make an array, anything else an
-- object whose keys are strings, or numbers written as strings. A nil inside a marked array
-- is null. Integral numbers within +-2^53 are written as integers (3, never 3.0); others as the
-- shortest of %.15g, %.16g, %.17g that reads back as the same double.
local M = {}

M.null = setmetatable({}, {__tostring = function() return "null" end})
M.object_mt = {}
M.array_mt = {}
M.bigint_mt = {
  __tostring = function(b) return b.digits end,
  __eq = function(a, b) return a.digits == b.digits end,
}

function M.object(t)
  return setmetatable(t or {}, M.object_mt)
end

function M.array(t)
  return setmetatable(t or {}, M.array_mt)
end

function M.is_object(t)
  return type(t) == "table" and getmetatable(t) == M.object_mt
end

function M.is_array(t)
  return type(t) == "table" and getmetatable(t) == M.array_mt
end

local function is_bigint(v)
  return type(v) == "table" and getmetatable(v) == M.bigint_mt
end

function M.tostring(v)
  return is_bigint(v) and v.digits or tostring(v)
end

local MAX_DEPTH = 200
local EXACT = 2 ^ 53 -- integers from here on are not all doubles
local floor, huge, char = math.floor, math.huge, string.char

-- Decoding -------------------------------------------------------------------------------

local UNESCAPE = {['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t"}
local LITERALS = {t = {"true", true}, f = {"false", false}, n = {"null", M.null}}

local function utf8(code)
  if code < 0x80 then
    return char(code)
  elseif code < 0x800 then
    return char(0xC0 + floor(code / 0x40), 0x80 + code % 0x40)
  elseif code < 0x10000 then
    return char(0xE0 + floor(code / 0x1000), 0x80 + floor(code / 0x40) % 0x40, 0x80 + code % 0x40)
  end
  return char(0xF0 + floor(code / 0x40000), 0x80 + floor(code / 0x1000) % 0x40,
    0x80 + floor(code / 0x40) % 0x40, 0x80 + code % 0x40)
end

-- Errors are thrown as a table, caught by M.decode; anything else thrown is a bug and re-raised.
local function decoder(text)
  local pos = 1

  local function fail(what)
    error({message = what .. " at byte " .. pos}, 0)
  end

  -- Skips whitespace and answers the character there ("" at the end).
  local function peek()
    pos = text:find("[^ \t\r\n]", pos) or #text + 1
    return text:sub(pos, pos)
  end

  local function hex4(at)
    local digits = text:match("^%x%x%x%x", at)
    return digits and tonumber(digits, 16)
  end

  local function str()
    local parts = {}
    pos = pos + 1
    while true do
      local stop = text:find('["\\%z\1-\31]', pos)
      if stop == nil then
        pos = #text + 1
        fail("unterminated string")
      end
      parts[#parts + 1] = text:sub(pos, stop - 1)
      pos = stop
      local c = text:sub(pos, pos)
      if c == '"' then
        pos = pos + 1
        return table.concat(parts)
      elseif c ~= "\\" then
        fail("control character in a string")
      end
      local e = text:sub(pos + 1, pos + 1)
      if UNESCAPE[e] then
        parts[#parts + 1] = UNESCAPE[e]
        pos = pos + 2
      elseif e == "u" then
        local code = hex4(pos + 2)
        if code == nil then
          fail("bad \\u escape")
        elseif code >= 0xDC00 and code <= 0xDFFF then
          fail("lone surrogate")
        elseif code >= 0xD800 and code <= 0xDBFF then
          local low = text:sub(pos + 6, pos + 7) == "\\u" and hex4(pos + 8)
          if not (low and low >= 0xDC00 and low <= 0xDFFF) then
            fail("lone surrogate")
          end
          code = 0x10000 + (code - 0xD800) * 0x400 + (low - 0xDC00)
          pos = pos + 6
        end
        parts[#parts + 1] = utf8(code)
        pos = pos + 6
      else
        fail("bad escape")
      end
    end
  end

  local function number()
    local int = text:match("^-?%d+", pos)
    if int == nil or int:find("^-?0%d") then
      fail("bad number")
    end
    local stop = pos + #int
    local frac = text:match("^%.%d*", stop) or ""
    local exp = text:match("^[eE][-+]?%d*", stop + #frac) or ""
    if frac == "." or exp:find("^[eE][-+]?$") then
      fail("bad number")
    end
    local n = tonumber(text:sub(pos, stop + #frac + #exp - 1))
    if frac == "" and exp == "" then
      pos = stop
      if n >= EXACT or n <= -EXACT then
        return setmetatable({digits = int}, M.bigint_mt)
      end
      return n == 0 and 0 or n -- -0 is the integer 0
    elseif n == huge or n == -huge then
      fail("number out of range")
    end
    pos = stop + #frac + #exp
    return n
  end

  local value

  local function array(depth)
    local t = setmetatable({}, M.array_mt)
    pos = pos + 1
    if peek() == "]" then
      pos = pos + 1
      return t
    end
    while true do
      t[#t + 1] = value(depth)
      local c = peek()
      if c == "]" then
        pos = pos + 1
        return t
      elseif c ~= "," then
        fail("expected ',' or ']'")
      end
      pos = pos + 1
    end
  end

  local function object(depth)
    local t = setmetatable({}, M.object_mt)
    pos = pos + 1
    if peek() == "}" then
      pos = pos + 1
      return t
    end
    while true do
      if peek() ~= '"' then
        fail("expected a string key")
      end
      local key = str()
      if peek() ~= ":" then
        fail("expected ':'")
      end
      pos = pos + 1
      t[key] = value(depth)
      local c = peek()
      if c == "}" then
        pos = pos + 1
        return t
      elseif c ~= "," then
        fail("expected ',' or '}'")
      end
      pos = pos + 1
    end
  end

  function value(depth)
    local c = peek()
    if c == "{" or c == "[" then
      if depth >= MAX_DEPTH then
        fail("nested deeper than " .. MAX_DEPTH)
      end
      return (c == "{" and object or array)(depth + 1)
    elseif c == '"' then
      return str()
    elseif c == "-" or c:find("^%d") then
      return number()
    end
    local literal = LITERALS[c]
    if literal and text:sub(pos, pos + #literal[1] - 1) == literal[1] then
      pos = pos + #literal[1]
      return literal[2]
    end
    fail(c == "" and "unexpected end" or "unexpected '" .. c .. "'")
  end

  return function()
    local v = value(0)
    if peek() ~= "" then
      fail("trailing characters")
    end
    return v
  end
end

function M.decode(text)
  if type(text) ~= "string" then
    return nil, "not a string: a " .. type(text)
  end
  local ok, result = pcall(decoder(text))
  if ok then
    return result
  elseif type(result) == "table" and result.message then
    return nil, result.message
  end
  error(result, 0)
end

-- Encoding -------------------------------------------------------------------------------

local ESCAPE = {['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f", ["\n"] = "\\n", ["\r"] = "\\r",
  ["\t"] = "\\t"}
for i = 0, 31 do
  ESCAPE[char(i)] = ESCAPE[char(i)] or string.format("\\u%04x", i)
end

local function quote(s)
  return '"' .. s:gsub('[%z\1-\31"\\]', ESCAPE) .. '"'
end

local function fail(what)
  error("json.encode: " .. what, 0)
end

local function number_text(n)
  if n ~= n or n == huge or n == -huge then
    fail("no JSON for " .. tostring(n))
  elseif n % 1 == 0 and n >= -EXACT and n <= EXACT then
    return n == 0 and "0" or string.format("%.0f", n) -- "0", not "-0"
  end
  for digits = 15, 16 do
    local s = string.format("%." .. digits .. "g", n)
    if tonumber(s) == n then
      return s
    end
  end
  return string.format("%.17g", n)
end

-- The largest key of t and the number of keys, or nil if a key is not an index (1, 2, ...).
local function indices(t)
  local last, count = 0, 0
  for k in pairs(t) do
    if type(k) ~= "number" or k < 1 or k % 1 ~= 0 then
      return nil
    end
    last, count = math.max(last, k), count + 1
  end
  return last, count
end

local encode

local function encode_array(t, last, out, depth)
  out[#out + 1] = "["
  for i = 1, last do
    if i > 1 then
      out[#out + 1] = ","
    end
    encode(t[i], out, depth)
  end
  out[#out + 1] = "]"
end

local function encode_object(t, out, depth)
  local keys, original = {}, {}
  for k in pairs(t) do
    local name = type(k) == "string" and k or type(k) == "number" and number_text(k)
      or fail("no JSON for a key of type " .. type(k))
    if original[name] ~= nil then
      fail("two keys written " .. quote(name))
    end
    keys[#keys + 1], original[name] = name, k
  end
  table.sort(keys)
  out[#out + 1] = "{"
  for i, name in ipairs(keys) do
    out[#out + 1] = (i > 1 and "," or "") .. quote(name) .. ":"
    encode(t[original[name]], out, depth)
  end
  out[#out + 1] = "}"
end

function encode(v, out, depth)
  local kind = type(v)
  if v == nil or v == M.null then
    out[#out + 1] = "null"
  elseif kind == "boolean" then
    out[#out + 1] = tostring(v)
  elseif kind == "number" then
    out[#out + 1] = number_text(v)
  elseif kind == "string" then
    out[#out + 1] = quote(v)
  elseif is_bigint(v) then
    out[#out + 1] = v.digits
  elseif kind ~= "table" then
    fail("no JSON for a " .. kind)
  elseif depth >= MAX_DEPTH then
    fail("nested deeper than " .. MAX_DEPTH .. " (or a table inside itself)")
  elseif M.is_array(v) then
    encode_array(v, indices(v) or fail("an array with a key that is not an index"), out, depth + 1)
  else
    local last, count = indices(v)
    if not M.is_object(v) and last and last > 0 and count == last then
      encode_array(v, last, out, depth + 1)
    else
      encode_object(v, out, depth + 1)
    end
  end
end

function M.encode(value)
  local out = {}
  encode(value, out, 0)
  return table.concat(out)
end

return M
