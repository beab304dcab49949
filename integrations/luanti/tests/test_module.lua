-- The SDK's key ledger and module against a world kept in a table, and its poll loop against
-- a gateway made of functions: run with
-- `lua5.1 integrations/luanti/tests/test_module.lua` or `luajit ...` from anywhere.
local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local dir = here .. "/../roadie/sdk"
local sdk = dofile(dir .. "/init.lua")(dir)
local json = sdk.json

local checks = dofile(here .. "/checks.lua")()
local check = checks.check

-- A journal in memory, which can be "restarted" from its text.
local function memory(text)
  local store = {text = text or ""}
  store.load = function() return store.text end
  store.append = function(line) store.text = store.text .. line end
  store.replace = function(t) store.text = t end
  return store
end

-- The ledger: answers and state survive a reopen; a torn last line is ignored.
do
  local store = memory()
  local ledger = sdk.ledger.open(store)
  ledger:remember("k1", 200, json.object({resources = json.array({}), output = json.null}))
  ledger:set("next_id", 7)
  ledger:set("gone", "soon")
  ledger:set("gone", nil)
  local again = sdk.ledger.open(memory(store.text .. '{"e":"answer","k":"k2","s":2'))
  check(again:answer("k1") and again:answer("k1").status == 200, "an answer survives a reopen")
  check(json.encode(again:answer("k1").body) == '{"output":null,"resources":[]}', "its body byte for byte")
  check(again:answer("k2") == nil, "a torn last line is ignored")
  check(again.skipped == 0, "a torn last line is not counted as damage")
  check(again:get("next_id") == 7 and again:get("gone") == nil, "the module's state survives a reopen")
end

-- Leases, rule 6 of docs/protocol.md §4.
do
  local ledger = sdk.ledger.open(memory())
  local t = "weather#britain"
  ledger:read("k1", 7, t)
  local ok, why = ledger:may_apply("k1", 7, t)
  check(ok and why == nil, "a borrow read first may apply")
  ledger:applied("k1", 7, t)
  ok, why = ledger:may_apply("k1", 7, t)
  check(ok and why == "done", "an apply applied already answers again without writing")
  check(ledger:may_restore("r1", 7, t), "a restore writes")
  ledger:restored("r1", t)
  ok, why = ledger:may_apply("k1", 7, t)
  check(not ok and why:find("given back", 1, true), "an apply after its restore is refused")
  check(not ledger:may_apply("k2", 7, t), "an unseen key of a run that gave every borrow back is refused")
  check(ledger:may_apply("k3", 8, t), "another run's new borrow may apply")
  check(ledger:may_restore("r1", 7, t), "a restore carried out already writes again when nothing was applied since")
  ledger:restored("r1", t)
  ledger:read("k3", 8, t)
  ledger:applied("k3", 8, t)
  check(not ledger:may_restore("r1", 7, t), "but not over a borrow applied since")
end

-- A module: the key ledger answers a retry, statuses name the field.
do
  local made = {} -- the world: ref -> key
  local spawned = 0
  local module = sdk.module.new({
    name = "toy",
    ledger = sdk.ledger.open(memory()),
    actions = {
      spawn = {
        reversible = "ledger",
        params = json.object({type = "object", additionalProperties = false, required = json.array({"count"}),
          properties = json.object({count = json.object({type = "integer", minimum = 1, maximum = 5})})}),
        run = function(p, key)
          local out = json.array({})
          for _ = 1, p.count do
            spawned = spawned + 1
            local ref = "t" .. spawned
            made[ref] = key
            out[#out + 1] = json.object({kind = "toy", ref = ref})
          end
          return out, json.object({count = p.count})
        end,
      },
    },
    leases = {
      weather = {targeted = true, read = function() return "clear" end, write = function() end},
    },
    revert = function(key, resources)
      for _, r in ipairs(resources) do
        if made[r.ref] == key then
          made[r.ref] = nil
        end
      end
      return {}
    end,
    find = function(key)
      local out = {}
      for ref, k in pairs(made) do
        if k == key then
          out[#out + 1] = {kind = "toy", ref = ref}
        end
      end
      return out
    end,
    inspect = function(_, ref, key)
      return made[ref] ~= nil, made[ref] == key
    end,
    tagged = function()
      local out = {}
      for ref, k in pairs(made) do
        out[#out + 1] = {kind = "toy", ref = ref, key = k}
      end
      return out
    end,
  })
  local paths = sdk.protocol.paths
  local body = json.decode('{"action":"spawn","run_id":7,"step_id":3,"idempotency_key":"k","attempt":1,'
    .. '"params":{"count":2}}')
  local s1, a1 = module:handle(paths.dispatch, body)
  local s2, a2 = module:handle(paths.dispatch, body)
  check(s1 == 200 and s2 == 200 and json.encode(a1) == json.encode(a2), "the same key answers the same")
  check(spawned == 2, "and acts once")
  local status, answer = module:handle(paths.dispatch, json.decode(
    '{"action":"spawn","run_id":7,"step_id":3,"idempotency_key":"k2","attempt":1,"params":{"count":9}}'))
  check(status == 422 and answer.error.field == "params.count", "bad params: 422 naming the field")
  status, answer = module:handle(paths.dispatch, json.decode(
    '{"action":"fly","run_id":7,"step_id":3,"idempotency_key":"k3","attempt":1,"params":{}}'))
  check(status == 404 and answer.error.field == "action", "an unknown action: 404")
  status = module:handle(paths.dispatch, json.decode('{"action":"spawn"}'))
  check(status == 400, "no key: 400")
  status, answer = module:handle(paths.inspect, json.decode(
    '{"action":"spawn","run_id":7,"idempotency_key":"k","resources":[{"kind":"toy","ref":"t1"}]}'))
  check(status == 200 and answer.resources[1].exists and answer.resources[1].ours, "inspect: exists and ours")
  status, answer = module:handle(paths.tagged, json.decode('{"after":null,"limit":1}'))
  check(status == 200 and #answer.objects == 1 and answer.next ~= json.null, "tagged pages")
  local _, rest = module:handle(paths.tagged, json.object({after = answer.next, limit = 5}))
  check(#rest.objects == 1 and rest.next == json.null and rest.objects[1].ref ~= answer.objects[1].ref,
    "the next page has the rest")
  status, answer = module:handle(paths.revert, json.decode(
    '{"action":"spawn","run_id":7,"idempotency_key":"k","resources":null}'))
  check(status == 200 and next(made) == nil, "revert by key alone (null resources) removes what the key made")
  check(json.encode(answer) == '{"failures":[]}', "and answers an empty list, not null")
  local lease = '{"lease":"weather","target":"britain","run_id":7,"idempotency_key":"%s","value":%s}'
  module:handle(paths.lease_read, json.decode(lease:format("b", "null")))
  check(module:handle(paths.lease_apply, json.decode(lease:format("b", '"storm"'))) == 200, "apply")
  check(module:handle(paths.lease_restore, json.decode(lease:format("restore-7-1", '"clear"'))) == 200, "restore")
  status, answer = module:handle(paths.lease_apply, json.decode(lease:format("b", '"storm"')))
  check(status == 422 and answer.error.field == "idempotency_key", "a late apply: 422")
  status = module:handle(paths.lease_read, json.decode('{"lease":"weather","target":null,"run_id":7}'))
  check(status == 422, "a targeted lease without a target: 422")
  local manifest = json.encode(module:manifest())
  check(manifest:find('"leases":[{', 1, true) and manifest:find('"inspect":true', 1, true), "the manifest")
end

-- The poll loop: every request signed under an id of its own, with every secret; a poll's
-- answer carried out only when it is signed for that poll, fresh, with one of the secrets.
do
  local protocol, paths = sdk.protocol, sdk.protocol.paths
  local old, new = "example-secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
  local now = 1767225600
  local pending, handled, logged, later = {}, {}, {}, nil
  local poller = sdk.poll.new({
    url = "http://gateway:7300/",
    module = "toy",
    secrets = {new, old},
    manifest = json.object({protocol = "roadie/v1", module = "toy", actions = json.array({})}),
    handle = function(path, body)
      handled[#handled + 1] = path .. " " .. json.encode(body)
      return 200, json.object({resources = json.array({})})
    end,
    http = function(request, done)
      pending[#pending + 1] = {request = request, done = done}
    end,
    now = function() return now end,
    random = function(n) return string.rep("\0", n) end, -- a poor source: ids must differ still
    after = function(_, fn) later = fn end,
    log = function(_, message) logged[#logged + 1] = message end,
    wait = 1,
  })

  local function header(request, name)
    return checks.header(request.headers, name)
  end
  local seen, requests, well_signed = {}, 0, true
  -- The oldest request sent to `path`, checked as the gateway checks it, and taken.
  local function take(path)
    for i, p in ipairs(pending) do
      if p.request.url == "http://gateway:7300" .. path then
        table.remove(pending, i)
        local r, id = p.request, header(p.request, "webhook-id")
        local given = header(r, "webhook-signature") or ""
        requests = requests + 1
        well_signed = well_signed and id ~= nil and not seen[id] and header(r, "X-Roadie-Module") == "toy"
          and header(r, "webhook-timestamp") == tostring(now) and select(2, given:gsub("v1,", "")) == 2
          and protocol.signed_by(old, given, id, tostring(now), "POST", path, r.data)
          and protocol.signed_by(new, given, id, tostring(now), "POST", path, r.data)
          and header(r, "X-Roadie-Signature") == nil
        seen[id or ""] = true
        return p, id
      end
    end
  end
  local function answer(p, secrets, id, text, timestamp)
    local t = tostring(timestamp or now)
    p.done({ok = true, code = 200, data = json.encode(json.object({id = id, timestamp = t, answer = text,
      signature = protocol.signatures(secrets, id, t, "ANSWER", paths.pull, text)}))})
  end
  local call = '{"calls":[{"id":%d,"kind":"dispatch","path":"/roadie/v1/dispatch","idempotency_key":"k%d",'
    .. '"body":{"action":"spawn","idempotency_key":"k%d"},"delivery":1,"token":"t%d"}]}'

  poller:start()
  take(paths.announce).done({ok = true, code = 200, data = '{"announced":"toy"}'})
  local poll, id = take(paths.pull)
  check(poll and header(poll.request, "X-Roadie-Features") == "delivery-token, signed-body",
    "announced, then polled for signed answers")
  answer(poll, old, id, call:format(1, 1, 1, 1))
  check(#handled == 1 and handled[1]:find("k1", 1, true), "a poll answer signed for that poll is carried out")
  local posted = take(paths.answer)
  check(posted and posted.request.data:find('"token":"t1"', 1, true), "and its answer posted, with its token")
  local first, first_id = poll, id
  poll, id = take(paths.pull)
  answer(poll, new, id, call:format(2, 2, 2, 2))
  check(#handled == 2, "a poll answer signed with the other secret is carried out too")
  take(paths.answer)
  poll, id = take(paths.pull)

  -- What an answer refused does: nothing carried out, a warning, and a new announce later.
  local function refused(what, why, respond)
    local before = #handled
    later, logged = nil, {}
    respond()
    check(#handled == before and #pending == 0 and later ~= nil and (logged[1] or ""):find(why, 1, true),
      what .. " is refused (" .. tostring(logged[1]) .. ")")
    if later == nil then
      checks.finish() -- the loop went on as if nothing were wrong: nothing more to learn from it
    end
    later()
    take(paths.announce).done({ok = true, code = 200, data = "{}"})
    poll, id = take(paths.pull)
  end
  refused("an answer recorded earlier, played back to a later poll", "answer to another request", function()
    answer(poll, old, first_id, call:format(3, 3, 3, 3))
  end)
  refused("an answer signed with a secret the module does not have", "wrongly signed answer", function()
    answer(poll, "whsec_c2VjcmV0IG9mIHNvbWVib2R5IGVsc2U=", id, call:format(4, 4, 4, 4))
  end)
  refused("a stale answer", "stale answer", function()
    answer(poll, old, id, call:format(5, 5, 5, 5), now - 301)
  end)
  refused("an unsigned answer", "unsigned answer", function()
    poll.done({ok = true, code = 200, data = call:format(6, 6, 6, 6)})
  end)
  check(first ~= poll, "each poll is a request of its own")
  answer(poll, {old, new}, id, call:format(7, 7, 7, 7))
  check(#handled == 3 and handled[3]:find("k7", 1, true), "after a refusal, the next signed answer is carried out")
  take(paths.answer)
  local done_with
  poller:report("k7", {{kind = "toy", ref = "t9"}}, function(recorded) done_with = recorded end)
  take(paths.report).done({ok = true, code = 200, data = '{"recorded":1,"rejected":[]}'})
  check(done_with == 1, "a report goes through")
  check(well_signed and requests == 16, "all " .. requests .. " requests signed with both secrets, each under "
    .. "an id of its own, timestamped, naming the module")
  poller:stop()
end

checks.finish()
