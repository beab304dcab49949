-- SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104) in pure Lua 5.1 / LuaJIT, loaded with
-- dofile (no `require`: Luanti's mod sandbox has none).
--
--   M.digest(msg), M.hex(msg)            the 32-byte digest, or its lowercase hex
--   M.hmac(key, msg), M.hmac_hex(key, msg)
--   M.tohex(bin)                         lowercase hex of any string
--   M.equal(a, b)                        string equality in a time that does not depend on
--                                        where the strings differ (for signatures)
--   M.backend                            "bit", "bit32" or "portable": where bit operations come from
--   M.new(backend)                       an instance on that backend, or nil if this interpreter
--                                        has no such library; M.new("portable") always works,
--                                        which is how tests force the fallback
--
-- The backend is LuaJIT's `bit` (a global in LuaJIT and in Luanti, else `require "bit"`), else
-- Lua 5.2's `bit32`, else a fallback in plain arithmetic. Every path gives the same bytes:
-- 32-bit words are held as numbers, reduced to [0, 2^32) with `% 2^32` after each sum (LuaJIT's
-- bit operations answer signed values, which that reduction also fixes), and no intermediate
-- value reaches 2^53, where doubles stop being exact integers.

local floor, char, byte, concat = math.floor, string.char, string.byte, table.concat
local WORD = 4294967296 -- 2^32

-- Bit operations from a library: bxor and band take any number of 32-bit words.
local function library_ops(lib)
  local ror = type(lib) == "table" and (lib.ror or lib.rrotate)
  if not (ror and lib.bxor and lib.band and lib.bnot and lib.rshift) then
    return nil
  end
  return {xor = lib.bxor, xor3 = lib.bxor, band = lib.band, bnot = lib.bnot, shr = lib.rshift, ror = ror}
end

-- Bit operations in arithmetic, on words in [0, 2^32): XOR a byte at a time from a 64 Ki
-- table, AND from XOR (a + b = (a XOR b) + 2 (a AND b)), shifts by dividing.
local function portable_ops()
  local nibble = {} -- XOR of two 4-bit values, nibble[a * 16 + b]
  for a = 0, 15 do
    for b = 0, 15 do
      local r, x, y = 0, a, b
      for place = 0, 3 do
        if x % 2 ~= y % 2 then
          r = r + 2 ^ place
        end
        x, y = floor(x / 2), floor(y / 2)
      end
      nibble[a * 16 + b] = r
    end
  end
  local X = {} -- XOR of two bytes, X[a * 256 + b]
  for a = 0, 255 do
    for b = 0, 255 do
      X[a * 256 + b] = nibble[floor(a / 16) * 16 + floor(b / 16)] * 16 + nibble[a % 16 * 16 + b % 16]
    end
  end

  local function xor(a, b)
    local r, scale = 0, 1
    for _ = 1, 4 do
      local x, y = a % 256, b % 256
      r = r + X[x * 256 + y] * scale
      a, b, scale = (a - x) / 256, (b - y) / 256, scale * 256
    end
    return r
  end

  local function xor3(a, b, c)
    local r, scale = 0, 1
    for _ = 1, 4 do
      local x, y, z = a % 256, b % 256, c % 256
      r = r + X[X[x * 256 + y] * 256 + z] * scale
      a, b, c, scale = (a - x) / 256, (b - y) / 256, (c - z) / 256, scale * 256
    end
    return r
  end

  local POW = {} -- 2^n by lookup: `^` is a call to pow() in Lua 5.1
  for n = 0, 32 do
    POW[n] = 2 ^ n
  end

  return {
    xor = xor,
    xor3 = xor3,
    band = function(a, b) return (a + b - xor(a, b)) / 2 end,
    bnot = function(a) return WORD - 1 - a end,
    shr = function(a, n) return (a - a % POW[n]) / POW[n] end,
    ror = function(a, n)
      local low = a % POW[n]
      return (a - low) / POW[n] + low * POW[32 - n]
    end,
  }
end

local K = {
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
}

local HEX = {}
for i = 0, 255 do
  HEX[char(i)] = string.format("%02x", i)
end

-- A word as 4 bytes, big-endian.
local function be32(n)
  return char(floor(n / 16777216), floor(n / 65536) % 256, floor(n / 256) % 256, n % 256)
end

local new

local function build(ops, backend)
  local xor, xor3, band, bnot, shr, ror = ops.xor, ops.xor3, ops.band, ops.bnot, ops.shr, ops.ror
  local M = {backend = backend, new = new}

  function M.digest(msg)
    -- Pad to a multiple of 64 bytes: 0x80, zeros, then the length in bits as 64 bits.
    local bits = #msg * 8
    msg = msg .. "\128" .. string.rep("\0", (55 - #msg) % 64) .. be32(floor(bits / WORD)) .. be32(bits % WORD)
    local h1, h2, h3, h4 = 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a
    local h5, h6, h7, h8 = 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19
    local w = {}
    for block = 1, #msg, 64 do
      for i = 1, 16 do
        local a, b, c, d = byte(msg, block + i * 4 - 4, block + i * 4 - 1)
        w[i] = ((a * 256 + b) * 256 + c) * 256 + d
      end
      for i = 17, 64 do
        local x, y = w[i - 15], w[i - 2]
        local s0 = xor3(ror(x, 7), ror(x, 18), shr(x, 3))
        local s1 = xor3(ror(y, 17), ror(y, 19), shr(y, 10))
        w[i] = (w[i - 16] + s0 + w[i - 7] + s1) % WORD
      end
      local a, b, c, d, e, f, g, h = h1, h2, h3, h4, h5, h6, h7, h8
      for i = 1, 64 do
        -- Ch and Maj are each the OR of two terms with no bit in common, so + can stand for OR.
        local ch = band(e, f) + band(bnot(e), g)
        local t1 = h + xor3(ror(e, 6), ror(e, 11), ror(e, 25)) + ch + K[i] + w[i]
        local maj = band(a, b) + band(c, xor(a, b))
        local t2 = xor3(ror(a, 2), ror(a, 13), ror(a, 22)) + maj
        a, b, c, d, e, f, g, h = (t1 + t2) % WORD, a, b, c, (d + t1) % WORD, e, f, g
      end
      h1, h2, h3, h4 = (h1 + a) % WORD, (h2 + b) % WORD, (h3 + c) % WORD, (h4 + d) % WORD
      h5, h6, h7, h8 = (h5 + e) % WORD, (h6 + f) % WORD, (h7 + g) % WORD, (h8 + h) % WORD
    end
    return be32(h1) .. be32(h2) .. be32(h3) .. be32(h4) .. be32(h5) .. be32(h6) .. be32(h7) .. be32(h8)
  end

  function M.tohex(bin)
    return (bin:gsub(".", HEX))
  end

  function M.hex(msg)
    return M.tohex(M.digest(msg))
  end

  -- The key, zero-padded to 64 bytes, XORed with a pad byte.
  local function padded(key, pad)
    local out = {}
    for i = 1, 64 do
      out[i] = char(xor(byte(key, i) or 0, pad))
    end
    return concat(out)
  end

  function M.hmac(key, msg)
    if #key > 64 then
      key = M.digest(key)
    end
    return M.digest(padded(key, 0x5c) .. M.digest(padded(key, 0x36) .. msg))
  end

  function M.hmac_hex(key, msg)
    return M.tohex(M.hmac(key, msg))
  end

  -- Every byte is compared, whatever came before: a sum of XORs is 0 only if all are.
  function M.equal(a, b)
    if type(a) ~= "string" or type(b) ~= "string" or #a ~= #b then
      return false
    end
    local diff = 0
    for i = 1, #a do
      diff = diff + xor(byte(a, i), byte(b, i))
    end
    return diff == 0
  end

  return M
end

-- A library from the environment, then from `require` where there is one.
local function find(name)
  local lib = rawget(_G, name)
  local require = rawget(_G, "require")
  if lib == nil and require ~= nil then
    local ok, found = pcall(require, name)
    lib = ok and found or nil
  end
  return lib
end

function new(backend)
  if backend == "portable" then
    return build(portable_ops(), backend)
  end
  local ops = (backend == "bit" or backend == "bit32") and library_ops(find(backend))
  return ops and build(ops, backend) or nil
end

return new("bit") or new("bit32") or new("portable")
