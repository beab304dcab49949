-- The SDK's key ledger and module against a world kept in a table: run with
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

checks.finish()
