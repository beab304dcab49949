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

-- A toy module over `ledger`: creatures in `world.made` (ref -> key), `world.spawned` of them
-- made so far, the weather of each region and a clock as leases, with `world.writes` lease writes.
local function toy(ledger, world)
  world.made, world.spawned, world.writes = world.made or {}, world.spawned or 0, world.writes or 0
  world.weather, world.clock = world.weather or {}, world.clock or 0.5
  local made = world.made
  return sdk.module.new({
    name = "toy",
    ledger = ledger,
    actions = {
      spawn = {
        reversible = "ledger",
        params = json.object({type = "object", additionalProperties = false, required = json.array({"count"}),
          properties = json.object({count = json.object({type = "integer", minimum = 1, maximum = 5})})}),
        run = function(p, key)
          local out = json.array({})
          for _ = 1, p.count do
            world.spawned = world.spawned + 1
            local ref = "t" .. world.spawned
            made[ref] = key
            out[#out + 1] = json.object({kind = "toy", ref = ref})
          end
          return out, json.object({count = p.count})
        end,
      },
    },
    leases = {
      weather = {
        targeted = true,
        read = function(region) return world.weather[region] or "clear" end,
        write = function(region, value)
          world.writes = world.writes + 1
          world.weather[region] = value
        end,
      },
      clock = {
        targeted = false,
        read = function() return world.clock end,
        write = function(_, value)
          world.writes = world.writes + 1
          world.clock = value
        end,
      },
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
end

local function count(t)
  local n = 0
  for _ in pairs(t) do
    n = n + 1
  end
  return n
end

-- A module: the key ledger answers a retry, statuses name the field.
do
  local world = {}
  local made = {}
  world.made = made
  local module = toy(sdk.ledger.open(memory()), world)
  local paths = sdk.protocol.paths
  local body = json.decode('{"action":"spawn","run_id":7,"step_id":3,"idempotency_key":"k","attempt":1,'
    .. '"params":{"count":2},"fence":1}')
  local s1, a1 = module:handle(paths.dispatch, body)
  local s2, a2 = module:handle(paths.dispatch, body)
  check(s1 == 200 and s2 == 200 and json.encode(a1) == json.encode(a2), "the same key answers the same")
  check(world.spawned == 2, "and acts once")
  local status, answer = module:handle(paths.dispatch, json.decode(
    '{"action":"spawn","run_id":7,"step_id":3,"idempotency_key":"k2","attempt":1,"params":{"count":9},"fence":1}'))
  check(status == 422 and answer.error.field == "params.count", "bad params: 422 naming the field")
  status, answer = module:handle(paths.dispatch, json.decode(
    '{"action":"fly","run_id":7,"step_id":3,"idempotency_key":"k3","attempt":1,"params":{},"fence":1}'))
  check(status == 404 and answer.error.field == "action", "an unknown action: 404")
  status = module:handle(paths.dispatch, json.decode('{"action":"spawn","fence":1}'))
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
    '{"action":"spawn","run_id":7,"idempotency_key":"k","resources":null,"fence":1}'))
  check(status == 200 and next(made) == nil, "revert by key alone (null resources) removes what the key made")
  check(json.encode(answer) == '{"failures":[]}', "and answers an empty list, not null")
  local lease = '{"lease":"weather","target":"britain","run_id":7,"idempotency_key":"%s","value":%s,"fence":1}'
  module:handle(paths.lease_read, json.decode(lease:format("b", "null")))
  check(module:handle(paths.lease_apply, json.decode(lease:format("b", '"storm"'))) == 200, "apply")
  check(module:handle(paths.lease_restore, json.decode(lease:format("restore-7-1", '"clear"'))) == 200, "restore")
  status, answer = module:handle(paths.lease_apply, json.decode(lease:format("b", '"storm"')))
  check(status == 422 and answer.error.field == "idempotency_key", "a late apply: 422")
  status = module:handle(paths.lease_read, json.decode('{"lease":"weather","target":null,"run_id":7}'))
  check(status == 422, "a targeted lease without a target: 422")
  local manifest = json.encode(module:manifest())
  check(manifest:find('"leases":[{', 1, true) and manifest:find('"inspect":true', 1, true)
    and manifest:find('"protocol":"roadie/v2"', 1, true), "the manifest, in roadie/v2")
end

-- Fences (roadie/v2): a call whose fence is older than the mark of its target (the step's
-- key; `lease#target`, or the lease alone) is refused with 412 "superseded" and does
-- nothing, not even answer from the ledger; equal or higher is accepted and raises the
-- mark; the marks are in the journal, so a restarted module keeps them.
do
  local paths = sdk.protocol.paths
  local store = memory()
  local world = {}
  local module = toy(sdk.ledger.open(store), world)
  local function spawn(key, fence, n)
    return module:handle(paths.dispatch, json.decode(string.format(
      '{"action":"spawn","run_id":7,"step_id":3,"idempotency_key":"%s","attempt":1,"params":{"count":%d},"fence":%s}',
      key, n or 2, fence)))
  end
  local function revert(key, fence)
    return module:handle(paths.revert, json.decode(string.format(
      '{"action":"spawn","run_id":7,"idempotency_key":"%s","resources":[],"fence":%s}', key, fence)))
  end
  local function lease(path, key, run, value, fence, name, target)
    return module:handle(path, json.decode(string.format(
      '{"lease":"%s","target":%s,"run_id":%d,"idempotency_key":"%s","value":%s%s}', name or "weather",
      target or '"britain"', run, key, value, fence and (',"fence":' .. fence) or "")))
  end
  -- Python's roadie.protocol.superseded_body("k", 3, 5), keys sorted.
  local python = '{"error":{"code":"superseded","fence":5,"field":"fence","message":"fence 3 is older than '
    .. 'fence 5, already accepted for k: a newer owner has acted","retryable":false}}'

  local s1, first = spawn("k", 5)
  check(s1 == 200 and world.spawned == 2 and module.ledger:mark("k") == 5, "a dispatch under fence 5: done, mark 5")
  local journal = store.text
  local status, answer = spawn("k", 3)
  check(status == 412 and json.encode(answer) == python,
    "a stale dispatch of the same key is refused: 412 superseded, the mark named (" .. json.encode(answer) .. ")")
  check(world.spawned == 2 and store.text == journal and module.ledger:mark("k") == 5,
    "and nothing is acted: nothing spawned, nothing written to the journal, the mark kept")
  status, answer = spawn("k", 5)
  check(status == 200 and json.encode(answer) == json.encode(first) and world.spawned == 2,
    "an equal fence is accepted: a retry gets the stored answer, and acts no more")
  status = spawn("k2", 1, 1)
  check(status == 200 and world.spawned == 3, "marks are per target: another key's fence is its own")

  status = revert("k", 4)
  check(status == 412 and count(world.made) == 3,
    "a revert older than the dispatch's fence is refused, nothing reverted")
  status = revert("k", 9)
  check(status == 200 and count(world.made) == 1 and module.ledger:mark("k") == 9, "a newer revert reverts, mark 9")
  journal = store.text
  status, answer = spawn("k", 5)
  check(status == 412 and answer.error.fence == 9 and answer.error.code == "superseded" and world.spawned == 3
    and store.text == journal, "a lapsed owner's dispatch after the revert: 412, nothing spawned, nothing stored")

  -- Leases: the target is `lease#target`; a restore under a newer claim fences the older
  -- owner's apply out, even under a key this module never saw (rule 6 alone would take it).
  check(lease(paths.lease_read, "b1", 7, "null") == 200, "a read takes no fence")
  check(lease(paths.lease_apply, "b1", 7, '"storm"', 5) == 200 and world.weather.britain == "storm"
    and module.ledger:mark("weather#britain") == 5, "an apply under fence 5 writes, mark weather#britain 5")
  check(lease(paths.lease_restore, "r7", 7, '"clear"', 8) == 200 and world.weather.britain == "clear",
    "a restore under fence 8 writes back")
  local writes = world.writes
  journal = store.text
  status, answer = lease(paths.lease_apply, "b1", 7, '"storm"', 5)
  check(status == 412 and answer.error.fence == 8 and answer.error.field == "fence" and world.weather.britain == "clear"
    and world.writes == writes and store.text == journal,
    "the stale apply after the newer restore: 412, nothing written")
  check(lease(paths.lease_read, "b2", 8, "null") == 200, "a read by another run, its fence not looked at")
  status, answer = lease(paths.lease_apply, "b2", 8, '"fog"', 6)
  check(status == 412 and world.weather.britain == "clear" and world.writes == writes,
    "an apply under a fence older than the restore's is refused before rule 6 would let a new borrow write")
  status = lease(paths.lease_apply, "b2", 8, '"fog"', 8)
  check(status == 200 and world.weather.britain == "fog", "an apply under an equal fence is accepted")
  check(lease(paths.lease_apply, "c1", 7, "0", 3, "clock", "null") == 200 and world.clock == 0
    and module.ledger:mark("clock") == 3, "an untargeted lease's fence is counted under the lease's name alone")
  check(lease(paths.lease_apply, "b3", 9, '"hail"', 3, "weather", '"avalon"') == 200,
    "another target of the same lease has a mark of its own")
  status = lease(paths.lease_restore, "r8", 7, "0.5", 2, "clock", "null")
  check(status == 412 and world.clock == 0, "a stale restore is refused too")

  -- Missing or malformed fences: 400 naming the field, nothing done; a read needs none.
  journal, writes = store.text, world.writes
  local spawned = world.spawned
  local bad = {
    {"no fence", module:handle(paths.dispatch, json.decode(
      '{"action":"spawn","run_id":7,"step_id":3,"idempotency_key":"k5","attempt":1,"params":{"count":1}}'))},
    {"fence 0", spawn("k5", "0")}, {"fence -1", spawn("k5", "-1")}, {"fence 1.5", spawn("k5", "1.5")},
    {'fence "5"', spawn("k5", '"5"')}, {"fence null", spawn("k5", "null")}, {"fence true", spawn("k5", "true")},
    {"fence 2^53", spawn("k5", "9007199254740992")}, {"fence 2^64", spawn("k5", "18446744073709551616")},
    {"a revert without one", module:handle(paths.revert, json.decode(
      '{"action":"spawn","run_id":7,"idempotency_key":"k2","resources":[]}'))},
    {"an apply without one", lease(paths.lease_apply, "b9", 9, '"snow"')},
    {"a restore without one", lease(paths.lease_restore, "r9", 9, '"clear"')},
  }
  for _, case in ipairs(bad) do
    local what, got, body = case[1], case[2], case[3]
    check(got == 400 and body.error.field == "fence", what .. ": 400 naming the fence (" .. tostring(got) .. ")")
  end
  check(world.spawned == spawned and world.writes == writes and store.text == journal and count(world.made) == 1,
    "and none of them did anything")
  check(spawn("k5", "9007199254740991", 1) == 200 and module.ledger:mark("k5") == 9007199254740991,
    "2^53-1 is the highest fence")

  -- A restart: the journal replayed, appended entries and then its compacted snapshot.
  local marks = {k = 9, k2 = 1, ["weather#britain"] = 8, ["weather#avalon"] = 3, clock = 3, k5 = 9007199254740991}
  for _, round in ipairs({"replayed from the journal", "replayed from the compacted journal"}) do
    local reopened = sdk.ledger.open(memory(store.text))
    store.text = reopened.store.text
    module = toy(reopened, world)
    local kept = true
    for target, fence in pairs(marks) do
      kept = kept and reopened:mark(target) == fence
    end
    check(kept, "after a restart every mark is back: " .. round)
    spawned, writes = world.spawned, world.writes
    status, answer = spawn("k", 8)
    check(status == 412 and answer.error.fence == 9 and world.spawned == spawned,
      "a stale dispatch is still refused after a restart: " .. round)
    status = lease(paths.lease_apply, "b1", 7, '"storm"', 7)
    check(status == 412 and world.writes == writes, "a stale apply is still refused after a restart: " .. round)
    check(spawn("k", 9) == 200 and world.spawned == spawned, "an equal fence still gets the stored answer: " .. round)
  end
  check(select(2, store.text:gsub("\n", "")) == 1, "compacted to one line")

  -- A journal written before roadie/v2 (no marks) opens, and its keys take their first fence.
  local old = sdk.ledger.open(memory('{"e":"state","v":{"seq":1,"answers":{"k":{"status":200,"body":{}}},'
    .. '"borrows":{},"restores":{},"applied_at":{},"data":{}}}\n'))
  check(old:answer("k") ~= nil and old:mark("k") == nil and old:fence("k", 1) and old:mark("k") == 1,
    "a journal from before fences opens with no marks; the first fence is taken")
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
    manifest = json.object({protocol = "roadie/v2", module = "toy", actions = json.array({})}),
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
  local call = '{"calls":[{"id":%d,"kind":"dispatch","path":"/roadie/v2/dispatch","idempotency_key":"k%d",'
    .. '"body":{"action":"spawn","idempotency_key":"k%d","fence":1},"delivery":1,"token":"t%d"}]}'

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
