-- The SDK's hashing, signing and JSON. Run from anywhere with
--   lua5.1 integrations/luanti/tests/test_sdk.lua   or   luajit integrations/luanti/tests/test_sdk.lua
-- SHA-256 and HMAC are checked on every bit library this interpreter has and on the portable
-- fallback, against FIPS 180-4 and RFC 4231 vectors and the worked example of docs/protocol.md
-- (read from the doc itself). Prints a line per failed check, then a summary; exits 1 on failure.
local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local sdk_dir = here .. "/../roadie/sdk"
local sha256 = dofile(sdk_dir .. "/sha256.lua")
local json = dofile(sdk_dir .. "/json.lua")

local checks = dofile(here .. "/checks.lua")()
local check = checks.check

local function unhex(h)
  return (h:gsub("%x%x", function(b) return string.char(tonumber(b, 16)) end))
end

-- SHA-256 ------------------------------------------------------------------------------

local hashes = {
  {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
  {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
  {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
    "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
  {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
    "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
  -- Either side of where the padding spills into a second block (from Python's hashlib).
  {string.rep("a", 55), "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
  {string.rep("a", 56), "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
  {string.rep("a", 64), "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
}
local million = {string.rep("a", 1000000), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"}
-- The portable path takes ~8 s over a million bytes in plain Lua 5.1: there it hashes 10,000.
local ten_thousand = {string.rep("a", 10000), "27dd1f61b867b6a0f6e9d8a41c43231de52107e53ae424de8f847b821db4b711"}

-- RFC 4231, test cases 1-7: key, data, HMAC-SHA-256 (case 5 truncated to 128 bits).
local rfc4231 = {
  {string.rep("\11", 20), "Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
  {"Jefe", "what do ya want for nothing?", "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
  {string.rep("\170", 20), string.rep("\221", 50),
    "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
  {unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"), string.rep("\205", 50),
    "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
  {string.rep("\12", 20), "Test With Truncation", "a3b6167473100ee06e0c796c2955552b"},
  {string.rep("\170", 131), "Test Using Larger Than Block-Size Key - Hash Key First",
    "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
  {string.rep("\170", 131), "This is a test using a larger than block-size key and a larger than block-size data. "
    .. "The key needs to be hashed before being used by the HMAC algorithm.",
    "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
}

-- The worked example of docs/protocol.md §1, from its "```text signing" block.
local doc = assert(io.open(here .. "/../../../docs/protocol.md")):read("*a")
local block = doc:match("```text signing\n(.-)\n```") or ""
local example = {}
for line in block:gmatch("[^\n]+") do
  local name, value = line:match("^(%w+): (.*)$")
  if name then
    example[name] = value
  end
end
local body = '{"action":"spawn","run_id":7,"step_id":3,"idempotency_key":"run7-spawn_orcs","attempt":1,'
  .. '"params":{"kind":"orc","region":"britain","count":2}}'
check(example.body == body, "the body of the doc's signing example is the one this test knows")
check(example.secret == "example-secret" and example.signature
  == "v1=1bc412dc6b8d3d9da82e1f5c43f10f576de2ef6bdccfbac6a120f2deae185c83", "the doc's secret and signature")
local canonical = "POST\n/roadie/v1/dispatch\n1767225600\n" .. (example.body or "")

local tested = {}
for _, name in ipairs({"bit", "bit32", "portable"}) do
  local s = sha256.new(name)
  if s then
    tested[#tested + 1] = name
    local on = " (" .. name .. ")"
    for _, case in ipairs(hashes) do
      check(s.hex(case[1]) == case[2], "SHA-256 of " .. #case[1] .. " bytes" .. on)
    end
    local long = (name == "portable" and not rawget(_G, "jit")) and ten_thousand or million
    check(s.hex(long[1]) == long[2], "SHA-256 of " .. #long[1] .. " times 'a'" .. on)
    check(#s.digest("abc") == 32 and s.tohex(s.digest("abc")) == hashes[2][2], "digest is 32 raw bytes" .. on)
    for i, case in ipairs(rfc4231) do
      local mac = s.hmac_hex(case[1], case[2])
      check(mac:sub(1, #case[3]) == case[3], "RFC 4231 test case " .. i .. on)
    end
    check(s.tohex(s.hmac(example.secret or "", canonical)) == "1bc412dc6b8d3d9da82e1f5c43f10f576de2ef6bdccfbac6a120f2deae185c83",
      "the worked example of docs/protocol.md" .. on)
    check(s.equal("v1=abc", "v1=abc") and s.equal("", ""), "equal: the same strings" .. on)
    check(not s.equal("v1=abc", "v1=abd") and not s.equal("x1=abc", "v1=abc"), "equal: different strings" .. on)
    check(not s.equal("v1=abc", "v1=ab") and not s.equal("v1=abc", nil), "equal: different lengths, not a string" .. on)
  end
end
check(tested[#tested] == "portable" and sha256.backend == tested[1], "the default backend is the first available")

-- JSON ---------------------------------------------------------------------------------

local function roundtrip(text)
  local value, err = json.decode(text)
  if value == nil then
    return "error: " .. err
  end
  return json.encode(value)
end
for _, case in ipairs({
  {"[]", "[]"}, {"{}", "{}"}, {'{"a":[],"b":{},"c":{"d":[],"e":{}}}', '{"a":[],"b":{},"c":{"d":[],"e":{}}}'},
  {'[{},[],{"x":[]}]', '[{},[],{"x":[]}]'}, {'{"failures":null}', '{"failures":null}'},
  {"1", "1"}, {"-7", "-7"}, {"-0", "0"}, {"1.0", "1"}, {"0.5", "0.5"}, {"0.1", "0.1"}, {"1.5e300", "1.5e+300"},
  {"-2.5E-3", "-0.0025"}, {"9007199254740991", "9007199254740991"}, {"9007199254740993", "9007199254740993"},
  {"-9007199254740993", "-9007199254740993"}, {"18446744073709551615", "18446744073709551615"},
  {'"\\u00e9\\ud83d\\ude00"', '"\195\169\240\159\152\128"'}, {'"é😀"', '"é😀"'},
  {'"tab\\there\\u0001\\u001f\\u0000"', '"tab\\there\\u0001\\u001f\\u0000"'}, {'"a\\/b\\"\\\\"', '"a/b\\"\\\\"'},
  {'"\127"', '"\127"'}, {' { "b" : [ true , false , null ] , "a" : 1 } ', '{"a":1,"b":[true,false,null]}'},
}) do
  local got = roundtrip(case[1])
  check(got == case[2], "JSON " .. case[1] .. " -> " .. case[2] .. " (got " .. got .. ")")
end

local decoded = json.decode('{"failures":null,"list":[],"map":{}}')
check(decoded.failures == json.null and decoded.absent == nil, "null decodes to json.null, apart from absent")
check(json.is_array(decoded.list) and json.is_object(decoded.map) and not json.is_array(decoded.map),
  "[] and {} decode marked apart")
check(json.decode("1.0") == 1 and json.decode("1") == 1 and json.decode("-1.5e300") == -1.5e300, "numbers decode")
local big = json.decode("18446744073709551615")
check(getmetatable(big) == json.bigint_mt and tostring(big) == "18446744073709551615"
  and json.tostring(big) == "18446744073709551615", "a big integer keeps its digits")
check(big == json.decode("18446744073709551615") and json.tostring(3) == "3", "big integers compare by digits")
check(type(json.decode("9007199254740991")) == "number", "2^53 - 1 is a number")
local negative_zero = -tonumber("0") -- made at run time: Lua 5.1 may fold a literal -0 into 0
check(1 / negative_zero < 0 and json.encode(negative_zero) == "0" and 1 / json.decode("-0") > 0, "-0 is 0")
check(json.decode('"\\u00e9\\ud83d\\ude00"') == "\195\169\240\159\152\128", "\\u escapes and surrogate pairs")

check(json.encode({}) == "{}" and json.encode({1, 2, 3}) == "[1,2,3]", "unmarked: empty is {}, 1..n an array")
check(json.encode({1, nil, 3}) == '{"1":1,"3":3}' and json.encode({[1] = 1, x = 2}) == '{"1":1,"x":2}',
  "unmarked: other keys make an object, numbers written as strings")
check(json.encode(json.array({})) == "[]" and json.encode(json.array()) == "[]" and json.encode(json.object({1}))
  == '{"1":1}', "marked tables keep their kind")
check(json.encode(json.array({1, nil, 3})) == "[1,null,3]", "a hole in a marked array is null")
check(json.encode({b = 1, a = 2, c = {z = 1, y = json.null, x = false}}) == '{"a":2,"b":1,"c":{"x":false,"y":null,"z":1}}',
  "keys in sorted order")
check(json.encode(3) == "3" and json.encode(-3.0) == "-3" and json.encode(2 ^ 53) == "9007199254740992"
  and json.encode(1e20) == "1e+20" and json.decode(json.encode(1 / 3)) == 1 / 3, "numbers encode exactly")
check(json.encode("a\n\t\r\b\f\1\31\"\\/é") == '"a\\n\\t\\r\\b\\f\\u0001\\u001f\\"\\\\/é"', "strings escaped")

local cyclic = {}
cyclic.self = cyclic
for _, bad in ipairs({
  {0 / 0, "NaN"}, {1 / 0, "infinity"}, {print, "a function"}, {{[true] = 1}, "a boolean key"},
  {{f = print}, "a function inside"}, {cyclic, "a table inside itself"}, {{[1] = 1, ["1"] = 2}, "keys 1 and \"1\""},
  {json.array({x = 1}), "an array with a non-index key"},
}) do
  local ok, err = pcall(json.encode, bad[1])
  check(not ok and type(err) == "string" and err:find("^json.encode: "), "encode raises on " .. bad[2])
end

for _, bad in ipairs({
  "", " ", "{", "[1,]", '{"a" 1}', '{"a":1,}', "[1 2]", '{1:2}', "01", "-01", "1.", ".5", "1e", "-", "+1",
  "[1] x", "nul", "True", '"abc', '"a\nb"', '"\\x"', '"\\u12"', '"\\ud800"', '"\\udc00"', '"\\ud800\\u0041"',
  "1e400", string.rep("[", 10000), string.rep("[", 201) .. string.rep("]", 201),
}) do
  local ok, value, err = pcall(json.decode, bad)
  check(ok and value == nil and type(err) == "string" and err:find("at byte %d+$"),
    "refused with a position: " .. bad:sub(1, 20) .. " (" .. tostring(ok and err or value) .. ")")
end
check(select(2, json.decode("[1,]")) == "unexpected ']' at byte 4", "the error names the byte")
check(json.decode(string.rep("[", 200) .. string.rep("]", 200)) ~= nil, "200 levels of nesting decode")
check(select(2, json.decode(nil)) ~= nil, "decode(nil) answers an error")

checks.finish(string.format("(sha256 backend: %s; tested: %s)", sha256.backend, table.concat(tested, ", ")))
