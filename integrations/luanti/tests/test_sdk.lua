-- The SDK's hashing, base64, signing and JSON. Run from anywhere with
--   lua5.1 integrations/luanti/tests/test_sdk.lua   or   luajit integrations/luanti/tests/test_sdk.lua
-- SHA-256 and HMAC are checked on every bit library this interpreter has and on the portable
-- fallback, against FIPS 180-4 and RFC 4231 vectors and the worked examples of docs/protocol.md
-- (read from the doc itself); base64 against RFC 4648; signing and opening a signed answer
-- against those examples and vectors made with Python's hmac. Prints a line per failed check,
-- then a summary; exits 1 on failure.
local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local sdk_dir = here .. "/../roadie/sdk"
local sha256 = dofile(sdk_dir .. "/sha256.lua")
local json = dofile(sdk_dir .. "/json.lua")
local base64 = dofile(sdk_dir .. "/base64.lua")
local protocol = dofile(sdk_dir .. "/init.lua")(sdk_dir).protocol

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

-- The worked examples of docs/protocol.md §1, from its two "```text signing" blocks: a
-- request, and its answer signed under the request's id.
local doc = assert(io.open(here .. "/../../../docs/protocol.md")):read("*a")
local examples = {}
for block in doc:gmatch("```text signing\n(.-)\n```") do
  local example = {}
  for line in block:gmatch("[^\n]+") do
    local name, value = line:match("^(%w+): (.*)$")
    if name then
      example[name] = value
    end
  end
  examples[#examples + 1] = example
end
local request, reply = examples[1] or {}, examples[2] or {}
check(#examples == 2, "docs/protocol.md has two signing examples (found " .. #examples .. ")")
check(request.secret == "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" and (request.signature or ""):find("^v1,"),
  "the doc's secret, and a signature")
check(reply.secret == request.secret and reply.id == request.id and reply.method == "ANSWER"
  and reply.path == request.path and (reply.signature or ""):find("^v1,"),
  "the doc's answer: the same secret and id, ANSWER, and a signature")
-- A roadie/v2 dispatch of this test's own (the doc's request, with its v2 path and a fence),
-- and its signatures made with Python's hmac: the doc's examples are checked above against
-- the HMAC of each backend, whatever version they show.
local body = '{"action":"spawn","run_id":7,"step_id":3,"idempotency_key":"run7-spawn_orcs","attempt":1,'
  .. '"params":{"kind":"orc","region":"britain","count":2},"fence":41}'
local dispatch_path, dispatch_id = "/roadie/v2/dispatch", "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"
local whsec_signature = "v1,Bj2ZbatKMak65VY7AeZBVFnNVCtfTmlNQ3K9LKuYGnw="
-- The secret's key, decoded by Python's base64 (not by the SDK's, which is tested apart).
local example_key = unhex("31f290f6bf06298aab4f08d43c3f082cf648a362da2da4b0")
local function content(example)
  return (example.id or "") .. "." .. (example.timestamp or "") .. "." .. (example.method or "") .. " "
    .. (example.path or "") .. "\n" .. (example.body or "")
end

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
    for i, example in ipairs(examples) do
      check("v1," .. base64.encode(s.hmac(example_key, content(example))) == example.signature,
        "worked example " .. i .. " of docs/protocol.md" .. on)
    end
    check(s.equal("v1=abc", "v1=abc") and s.equal("", ""), "equal: the same strings" .. on)
    check(not s.equal("v1=abc", "v1=abd") and not s.equal("x1=abc", "v1=abc"), "equal: different strings" .. on)
    check(not s.equal("v1=abc", "v1=ab") and not s.equal("v1=abc", nil), "equal: different lengths, not a string" .. on)
  end
end
check(tested[#tested] == "portable" and sha256.backend == tested[1], "the default backend is the first available")

-- Base64 -------------------------------------------------------------------------------

-- RFC 4648 §10.
for _, case in ipairs({{"", ""}, {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"}, {"foob", "Zm9vYg=="},
  {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"}}) do
  check(base64.encode(case[1]) == case[2], "base64 of '" .. case[1] .. "' is '" .. case[2] .. "'")
  check(base64.decode(case[2]) == case[1], "base64 '" .. case[2] .. "' decodes to '" .. case[1] .. "'")
end
local every = {}
for i = 0, 255 do
  every[#every + 1] = string.char(i)
end
every = table.concat(every)
check(base64.decode(base64.encode(every)) == every, "every byte value goes through base64 and back")
check(base64.encode("\251\255\191") == "+/+/" and base64.encode_url("\251\255\191") == "-_-_"
  and base64.encode_url("f") == "Zg", "the URL-safe alphabet, unpadded")
for _, bad in ipairs({"Zg", "Zg=", "Zg===", "Z===", "=Zm9", "Zm=v", "Zg==Zm9v", "Zm9v!A==", "Zm9v Yg==", "Zm9v\n",
  "-_-_", false}) do
  local value, why = base64.decode(bad)
  check(value == nil and type(why) == "string", "base64 refuses " .. tostring(bad):gsub("\n", "\\n"))
end

-- Signing (docs/protocol.md §1) ----------------------------------------------------------

local whsec, plain = request.secret or "", "example-secret"
-- Made with Python's hmac over the content of this test's v2 dispatch, keyed with plain's bytes.
local plain_signature = "v1,RfElixvVi/2NDWhf6fLxFY1Dq5y9amDvoSloybjxp50="
for i, example in ipairs(examples) do
  check(protocol.signature(example.secret, example.id, example.timestamp, example.method, example.path,
    example.body) == example.signature, "protocol.signature gives worked example " .. i)
end
check(protocol.secret_bytes(whsec) == example_key, "a whsec_ secret's key is its base64 decoded")
check(protocol.secret_bytes(plain) == plain, "any other secret's key is its bytes")
check(protocol.signature(plain, dispatch_id, "1767225600", "post", dispatch_path, body) == plain_signature,
  "a plain secret signs as its bytes (and the method goes upper case)")
check(protocol.signature(whsec, dispatch_id, "1767225600", "POST", dispatch_path, body) == whsec_signature,
  "a whsec_ secret signs a v2 dispatch as Python's hmac does")
check(protocol.paths.dispatch == dispatch_path and protocol.paths.pull == "/roadie/v2/pull"
  and protocol.VERSION == "roadie/v2", "the SDK speaks roadie/v2")
for _, tail in ipairs({"", "MfKQ9r8G!", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS"}) do
  local bad = "whsec_" .. tail
  local key, why = protocol.secret_bytes(bad)
  local list, why_list = protocol.secret_list(whsec .. " " .. bad)
  check(key == nil and list == nil and why == why_list and (tail == "" or not why:find(tail, 1, true)),
    "a whsec_ secret that is no base64 is refused, without showing it: " .. bad)
end
local function same(a, b)
  return table.concat(a or {"(nil)"}, "|") == table.concat(b, "|")
end
check(same(protocol.secret_list(" whsec_QQ==  whsec_Qg==\n\twhsec_Qw== "), {"whsec_QQ==", "whsec_Qg==", "whsec_Qw=="})
  and same(protocol.secret_list({"a", "", "b c"}), {"a", "b c"}),
  "several secrets: a string of whsec_ secrets split on whitespace, a list as given")
check(same(protocol.secret_list(" correct horse\tbattery staple\n"), {"correct horse\tbattery staple"})
  and protocol.secret_list("whsec_QQ== plain") == nil and protocol.secret_list("plain whsec_QQ==") == nil,
  "any other string is one secret, spaces and all, never several weak ones; whsec_ among other words is refused")
check(protocol.secret_list("  ") == nil and protocol.secret_list({}) == nil and protocol.secret_list(nil) == nil,
  "no secret is refused")

-- The headers of the doc's request, as it shows them.
local header = checks.header
local lines, id = protocol.headers(whsec, "sandbox", request.path or "", request.body or "", 1767225600,
  "run7-spawn_orcs", request.id)
check(id == request.id and header(lines, "webhook-id") == request.id and header(lines, "webhook-timestamp")
  == "1767225600" and header(lines, "webhook-signature") == request.signature, "the headers of the doc's request")
check(header(lines, "X-Roadie-Key") == "run7-spawn_orcs" and header(lines, "X-Roadie-Module") == "sandbox"
  and header(lines, "X-Roadie-Signature") == nil and header(lines, "X-Roadie-Timestamp") == nil,
  "the key and module headers stay, the old signing headers are gone")
lines = protocol.headers({whsec, plain}, "sandbox", dispatch_path, body, 1767225600.9, nil, dispatch_id)
check(header(lines, "webhook-signature") == whsec_signature .. " " .. plain_signature
  and header(lines, "webhook-timestamp") == "1767225600" and header(lines, "X-Roadie-Key") == "-",
  "two secrets: two entries, in order; whole seconds; no key")
check(header(protocol.headers({whsec, "whsec_QQ=="}, "m", "/p", "", 1, nil, "x"), "webhook-signature")
  == header(protocol.headers(whsec .. " whsec_QQ==", "m", "/p", "", 1, nil, "x"), "webhook-signature"),
  "secrets as a list or in one string sign the same")
lines, id = protocol.headers(plain, "m", "/p", "", 1)
check(id:find("^msg_[%w_-]+$") and #id == 26 and header(lines, "webhook-id") == id, "a fresh id when none is given")

-- Any entry made with any secret verifies.
local entry = protocol.signature(plain, "msg_a", "1", "POST", "/p", "{}")
local other = protocol.signature(whsec, "msg_a", "1", "POST", "/p", "{}")
check(protocol.signed_by(plain, entry, "msg_a", "1", "POST", "/p", "{}")
  and protocol.signed_by({whsec, plain}, entry, "msg_a", "1", "POST", "/p", "{}")
  and protocol.signed_by(plain, "v1,bm9wZQ== " .. entry, "msg_a", "1", "POST", "/p", "{}")
  and protocol.signed_by(whsec, entry .. " " .. other, "msg_a", "1", "POST", "/p", "{}"),
  "an entry of any of the secrets verifies, wherever it stands in the header")
check(not protocol.signed_by("another", entry .. " " .. other, "msg_a", "1", "POST", "/p", "{}")
  and not protocol.signed_by(plain, entry, "msg_b", "1", "POST", "/p", "{}")
  and not protocol.signed_by(plain, entry, "msg_a", "2", "POST", "/p", "{}")
  and not protocol.signed_by(plain, entry, "msg_a", "1", "ANSWER", "/p", "{}")
  and not protocol.signed_by(plain, entry, "msg_a", "1", "POST", "/q", "{}")
  and not protocol.signed_by(plain, entry, "msg_a", "1", "POST", "/p", "{} ")
  and not protocol.signed_by(plain, "", "msg_a", "1", "POST", "/p", "{}"),
  "another secret, id, timestamp, method, path or body does not verify, nor nothing")

-- Request ids: well formed and never twice, even from a host whose random bytes repeat.
local function ids(random)
  local seen, count, good = {}, 0, true
  for _ = 1, 2000 do
    local new = protocol.new_id(random)
    good = good and #new == 26 and new:find("^msg_[A-Za-z0-9_-]+$") ~= nil
    if not seen[new] then
      seen[new], count = true, count + 1
    end
  end
  return good and count == 2000
end
check(ids(nil), "2000 ids from math.random: all distinct, msg_ and 22 URL-safe characters")
check(ids(function(n) return string.rep("\0", n) end), "2000 ids from a source that always says zero: all distinct")

-- Opening a signed poll answer (docs/protocol.md §5).
local pull = protocol.paths.pull
local function signed(secrets, id, timestamp, text, path, method)
  return json.encode(json.object({id = id, timestamp = timestamp, answer = text,
    signature = protocol.signatures(secrets, id, timestamp, method or "ANSWER", path or pull, text)}))
end
local function refused(raw, start, secrets, now)
  local answer, why = protocol.open_signed(secrets or plain, "msg_poll1", pull, raw, now or 1767225600)
  return answer == nil and type(why) == "string" and why:find(start, 1, true) == 1
end
local opened = protocol.open_signed(reply.secret or "", reply.id, reply.path or "", json.encode(json.object({
  id = reply.id, timestamp = reply.timestamp, signature = reply.signature, answer = reply.body})), 1767225601)
check(type(opened) == "table" and opened.resources[1].ref == "0x40000001", "the doc's answer opens")
local python = '{"answer":"{\\"calls\\":[]}","id":"msg_poll1","signature":"v1,JUTknzBuZ6QmYU9NPolXhoxI3AJccsdV6tVk2kSjEF4=",'
  .. '"timestamp":"1767225600"}' -- Python's hmac, over msg_poll1.1767225600.ANSWER /roadie/v2/pull\n{"calls":[]}
opened = protocol.open_signed(plain, "msg_poll1", pull, python, 1767225600)
check(type(opened) == "table" and type(opened.calls) == "table" and #opened.calls == 0, "a poll answer opens")
check(signed(plain, "msg_poll1", "1767225600", '{"calls":[]}') == python, "and signs the same")
local both = {whsec, plain}
check(protocol.open_signed(both, "msg_poll1", pull, python, 1767225600 + 300) ~= nil
  and protocol.open_signed(both, "msg_poll1", pull, signed(whsec, "msg_poll1", "1767225600", "{}"), 1767225600)
  and protocol.open_signed(plain, "msg_poll1", pull, signed(both, "msg_poll1", "1767225600", "{}"), 1767225600),
  "two secrets: an answer signed with either opens, and one signed with both")
check(refused(signed(plain, "msg_poll0", "1767225600", "{}"), "answer to another request"),
  "an answer signed for another request is refused")
local relabelled = json.decode(signed(plain, "msg_poll0", "1767225600", "{}"))
relabelled.id = "msg_poll1"
check(refused(json.encode(relabelled), "wrongly signed answer"), "and so is one relabelled with the poll's id")
check(refused(python, "stale answer", plain, 1767225600 + 301) and refused(python, "stale answer", plain, 1767225600 - 301),
  "an answer more than 300 s away from this clock is stale")
check(refused(python, "wrongly signed answer", "another-secret") and refused(python, "wrongly signed answer", whsec),
  "an answer signed with another secret is refused")
check(refused(signed(plain, "msg_poll1", "1767225600", "{}", protocol.paths.answer), "wrongly signed answer")
  and refused(signed(plain, "msg_poll1", "1767225600", "{}", pull, "POST"), "wrongly signed answer"),
  "a signature for another path, or a request's, passes for no answer")
check(refused(python:gsub("%[%]", "[1]"), "wrongly signed answer"), "a tampered answer is refused")
check(refused('{"calls":[]}', "unsigned answer") and refused("", "unsigned answer")
  and refused('{"timestamp":"1767225600","signature":"v1=5c0d","answer":"{}"}', "unsigned answer")
  and refused(python:gsub('"v1,[^"]*"', '""'), "unsigned answer")
  and refused(python:gsub('"1767225600"', '"1767225600.0"'), "unsigned answer"),
  "an answer without a signature, an id, or whole seconds is refused as unsigned")

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
