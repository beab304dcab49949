-- Base64 (RFC 4648) in pure Lua 5.1 / LuaJIT, loaded with dofile (no `require`: Luanti's mod
-- sandbox has none). Plain arithmetic: no bit library needed.
--
--   M.encode(bin)       the standard alphabet, padded with "=" (signatures)
--   M.encode_url(bin)   "-" and "_" in place of "+" and "/", unpadded (request ids)
--   M.decode(text)      the bytes, or nil and why; only the standard alphabet, padded, and
--                       nothing else (no spaces, no line breaks), as a secret is written

local floor, char, byte, concat = math.floor, string.char, string.byte, table.concat

local STANDARD = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local URL = STANDARD:sub(1, 62) .. "-_"
local PAD = byte("=")

local function digits(alphabet)
  local t = {}
  for i = 1, 64 do
    t[i - 1] = alphabet:sub(i, i)
  end
  return t
end

local VALUE = {} -- the 6 bits of each character of the standard alphabet
for i = 1, 64 do
  VALUE[byte(STANDARD, i)] = i - 1
end

-- Three bytes make four characters; a last group of one or two makes two or three, then pad.
local function encode(bin, d, pad)
  local out = {}
  for i = 1, #bin, 3 do
    local a, b, c = byte(bin, i, i + 2)
    local n = (a * 256 + (b or 0)) * 256 + (c or 0)
    out[#out + 1] = d[floor(n / 262144)] .. d[floor(n / 4096) % 64]
      .. (b and d[floor(n / 64) % 64] or pad) .. (c and d[n % 64] or pad)
  end
  return concat(out)
end

local M = {}
local standard, url = digits(STANDARD), digits(URL)

function M.encode(bin)
  return encode(bin, standard, "=")
end

function M.encode_url(bin)
  return encode(bin, url, "")
end

function M.decode(text)
  if type(text) ~= "string" or #text % 4 ~= 0 then
    return nil, "base64 comes in groups of 4 characters"
  end
  local out = {}
  for i = 1, #text, 4 do
    local c1, c2, c3, c4 = byte(text, i, i + 3)
    local v1, v2, v3, v4 = VALUE[c1], VALUE[c2], VALUE[c3], VALUE[c4]
    -- "=" only ends the text: "xx==" or "xxx="
    local last = i + 3 == #text
    if v1 == nil or v2 == nil or (v3 == nil and not (last and c3 == PAD and c4 == PAD))
        or (v4 == nil and not (last and c4 == PAD)) then
      return nil, "not base64 at byte " .. i
    end
    local n = ((v1 * 64 + v2) * 64 + (v3 or 0)) * 64 + (v4 or 0)
    local a, b, c = floor(n / 65536), floor(n / 256) % 256, n % 256
    out[#out + 1] = v4 and char(a, b, c) or v3 and char(a, b) or char(a)
  end
  return concat(out)
end

return M
