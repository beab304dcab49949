-- A module: its actions, leases, inspect and tagged, answering each protocol call as a
-- push server would (docs/protocol.md §2-4), through the key ledger, its fences first.
-- Transport-free: the poll loop (or an HTTP server) hands it a path and a decoded body, it
-- gives back a status and a body.
return function(sdk)
  local json, protocol = sdk.json, sdk.protocol
  local M = {}
  local Module = {}
  Module.__index = Module

  -- Raise from an action, a lease or a lookup to answer with this status.
  function M.fail(status, message, field, retryable)
    error({roadie = true, status = status, message = message, field = field, retryable = retryable}, 0)
  end
  local fail = M.fail

  -- A small JSON Schema checker: the keywords a hand-written params schema uses.
  -- Fills in defaults; fails with 422 naming the field.
  local function check(schema, value, where)
    local kind = schema.type
    local function wrong(what)
      fail(422, where .. ": " .. what, where)
    end
    if value == nil or value == json.null then
      if kind == "null" then
        return value
      end
      wrong("is required")
    end
    if kind == "object" then
      if type(value) ~= "table" or json.is_array(value) then
        wrong("should be an object")
      end
      for name, sub in pairs(schema.properties or {}) do
        if value[name] == nil and sub.default ~= nil then
          value[name] = sub.default
        end
      end
      for _, name in ipairs(schema.required or {}) do
        if value[name] == nil then
          fail(422, where .. "." .. name .. ": is required", where .. "." .. name)
        end
      end
      for name, sub in pairs(value) do
        local spec = (schema.properties or {})[name]
        if spec then
          value[name] = check(spec, sub, where .. "." .. name)
        elseif schema.additionalProperties == false then
          fail(422, where .. "." .. tostring(name) .. ": is not a parameter of this action",
            where .. "." .. tostring(name))
        end
      end
    elseif kind == "array" then
      if type(value) ~= "table" or json.is_object(value) then
        wrong("should be a list")
      end
      if schema.minItems and #value < schema.minItems then
        wrong("should have at least " .. schema.minItems .. " items")
      end
      if schema.maxItems and #value > schema.maxItems then
        wrong("should have at most " .. schema.maxItems .. " items")
      end
      for i, item in ipairs(value) do
        value[i] = check(schema.items or {}, item, where .. "." .. (i - 1))
      end
    elseif kind == "integer" or kind == "number" then
      if type(value) ~= "number" or value ~= value then
        wrong("should be a " .. kind)
      end
      if kind == "integer" and value ~= math.floor(value) then
        wrong("should be an integer")
      end
      if schema.minimum and value < schema.minimum then
        wrong("should be at least " .. schema.minimum)
      end
      if schema.maximum and value > schema.maximum then
        wrong("should be at most " .. schema.maximum)
      end
    elseif kind == "string" then
      if type(value) ~= "string" then
        wrong("should be a string")
      end
      if schema.minLength and #value < schema.minLength then
        wrong("should have at least " .. schema.minLength .. " characters")
      end
      if schema.maxLength and #value > schema.maxLength then
        wrong("should have at most " .. schema.maxLength .. " characters")
      end
    elseif kind == "boolean" and type(value) ~= "boolean" then
      wrong("should be true or false")
    end
    if schema.enum then
      for _, allowed in ipairs(schema.enum) do
        if allowed == value then
          return value
        end
      end
      wrong("should be one of " .. json.encode(schema.enum))
    end
    return value
  end
  M.check = check

  local function key_of(body)
    local key = body.idempotency_key
    if type(key) ~= "string" or #key < 1 or #key > 190 then
      fail(400, "malformed request: idempotency_key should be 1-190 characters", "idempotency_key")
    end
    return key
  end

  -- The fence of a call that changes the world (dispatch, revert, lease apply and restore).
  local function fence_of(body)
    local fence = body.fence
    if not protocol.valid_fence(fence) then
      fail(400, "malformed request: fence should be an integer from 1 to 2^53-1 (roadie/v2 fences dispatch, "
        .. "revert, lease apply and restore)", "fence")
    end
    return fence
  end

  -- Refuse, with SUPERSEDED and nothing done, a call whose fence is older than the mark of
  -- its target; else raise the mark. Before every other rule of the key ledger: a stale
  -- owner does not even get a stored answer back.
  function Module:_fence(target, fence)
    local accepted, mark = self.ledger:fence(target, fence)
    if not accepted then
      error({roadie = true, status = protocol.SUPERSEDED, body = protocol.superseded_body(target, fence, mark)}, 0)
    end
  end

  local function resources_of(body)
    local list = body.resources
    if list == nil or list == json.null then
      return {}
    end
    if type(list) ~= "table" or json.is_object(list) then
      fail(400, "malformed request: resources should be a list", "resources")
    end
    for i, r in ipairs(list) do
      if type(r) ~= "table" or type(r.kind) ~= "string" or type(r.ref) ~= "string" then
        fail(400, "malformed request: resources." .. (i - 1) .. " needs a kind and a ref", "resources")
      end
    end
    return list
  end

  -- def = {name, description, actions = {[name] = {reversible, description, params, run, order?}},
  --        leases = {[name] = {targeted, description, value, read, write}},
  --        revert(key, resources) -> failures, find(key) -> resources,
  --        inspect(kind, ref, key) -> exists, ours, tagged() -> objects, ledger}
  function M.new(def)
    return setmetatable({def = def, ledger = def.ledger}, Module)
  end

  function Module:manifest()
    local def = self.def
    local actions, leases = json.array({}), json.array({})
    local names = {}
    for name in pairs(def.actions) do
      names[#names + 1] = name
    end
    -- By `order` (lowest first; the conformance kit tests the first ledger action), then name.
    table.sort(names, function(a, b)
      local oa, ob = def.actions[a].order or math.huge, def.actions[b].order or math.huge
      if oa ~= ob then
        return oa < ob
      end
      return a < b
    end)
    for _, name in ipairs(names) do
      local a = def.actions[name]
      actions[#actions + 1] = json.object({
        name = name, reversible = a.reversible, description = a.description,
        params = a.params or json.object({type = "object"}),
      })
    end
    names = {}
    for name in pairs(def.leases or {}) do
      names[#names + 1] = name
    end
    table.sort(names)
    for _, name in ipairs(names) do
      local l = def.leases[name]
      leases[#leases + 1] = json.object({name = name, targeted = l.targeted and true or false,
        description = l.description, value = l.value})
    end
    return json.object({
      protocol = protocol.VERSION, module = def.name, description = def.description,
      actions = actions, leases = leases, inspect = def.inspect ~= nil, tagged = def.tagged ~= nil,
    })
  end

  function Module:_dispatch(body)
    local key = key_of(body)
    local fence = fence_of(body)
    local action = self.def.actions[body.action]
    if action == nil then
      fail(404, string.format("module '%s' has no action '%s'", self.def.name, tostring(body.action)), "action")
    end
    self:_fence(key, fence)
    local stored = self.ledger:answer(key)
    if stored ~= nil then
      return stored.status, stored.body
    end
    local params = check(action.params or {type = "object"}, body.params or json.object({}), "params")
    local resources, output = action.run(params, key, body)
    local answer = json.object({resources = json.array(resources or {}), output = output or json.null})
    self.ledger:remember(key, 200, answer)
    return 200, answer
  end

  -- What a key made: its stored answer's resources and whatever the world holds tagged
  -- with it (a call whose answer was lost, something its objects made by themselves).
  function Module:_made_by(key)
    local seen, all = {}, {}
    local function add(r)
      local id = r.kind .. "\0" .. r.ref
      if not seen[id] then
        seen[id] = true
        all[#all + 1] = r
      end
    end
    local stored = self.ledger:answer(key)
    if stored and type(stored.body) == "table" and type(stored.body.resources) == "table" then
      for _, r in ipairs(stored.body.resources) do
        add(r)
      end
    end
    for _, r in ipairs(self.def.find(key)) do
      add(r)
    end
    return all
  end

  function Module:_revert(body)
    local key = key_of(body)
    local resources = resources_of(body)
    self:_fence(key, fence_of(body))
    if #resources == 0 then
      resources = self:_made_by(key)
    end
    return 200, json.object({failures = json.array(self.def.revert(key, resources) or {})})
  end

  function Module:_inspect(body)
    if self.def.inspect == nil then
      fail(404, "this module answers no inspect", "path")
    end
    local key = key_of(body)
    local out = json.array({})
    for _, r in ipairs(resources_of(body)) do
      local exists, ours = self.def.inspect(r.kind, r.ref, key)
      out[#out + 1] = json.object({kind = r.kind, ref = r.ref, exists = exists and true or false,
        ours = (exists and ours) and true or false})
    end
    return 200, json.object({resources = out})
  end

  function Module:_tagged(body)
    if self.def.tagged == nil then
      fail(404, "this module answers no tagged", "path")
    end
    local limit = body.limit
    if limit == nil or limit == json.null then
      limit = 500
    end
    if type(limit) ~= "number" or limit < 1 or limit > 5000 then
      fail(400, "malformed request: limit should be 1-5000", "limit")
    end
    local after = body.after ~= json.null and body.after or nil
    local objects = self.def.tagged()
    table.sort(objects, function(a, b)
      return a.kind .. "\0" .. a.ref < b.kind .. "\0" .. b.ref
    end)
    local page = json.array({})
    local next_after = json.null
    for _, o in ipairs(objects) do
      local at = o.kind .. "\0" .. o.ref
      if after == nil or at > after then
        if #page == limit then
          next_after = page[#page].kind .. "\0" .. page[#page].ref
          break
        end
        page[#page + 1] = json.object(o)
      end
    end
    return 200, json.object({objects = page, next = next_after})
  end

  function Module:_lease(body)
    local lease = self.def.leases and self.def.leases[body.lease]
    if lease == nil then
      fail(404, string.format("module '%s' has no lease '%s'", self.def.name, tostring(body.lease)), "lease")
    end
    local target = body.target ~= json.null and body.target or nil
    if lease.targeted and type(target) ~= "string" then
      fail(422, "lease '" .. body.lease .. "' needs a target", "target")
    elseif not lease.targeted and target ~= nil then
      fail(422, "lease '" .. body.lease .. "' takes no target", "target")
    end
    local key = body.idempotency_key ~= json.null and body.idempotency_key or nil
    local run = body.run_id ~= json.null and body.run_id or nil
    return lease, target, key, run, body.lease .. "#" .. (target or "")
  end

  -- A lease call that writes: its fence checked against the lease target's mark first.
  function Module:_lease_write(body)
    local lease, target, key, run, id = self:_lease(body)
    key = key or key_of(body)
    self:_fence(protocol.lease_fence_target(body.lease, target), fence_of(body))
    return lease, target, key, run, id
  end

  function Module:_lease_read(body)
    local lease, target, key, run, id = self:_lease(body)
    local value = lease.read(target)
    if key ~= nil then
      self.ledger:read(key, run, id)
    end
    return 200, json.object({value = value == nil and json.null or value})
  end

  function Module:_lease_apply(body)
    local lease, target, key, run, id = self:_lease_write(body)
    local allowed, why = self.ledger:may_apply(key, run, id)
    if not allowed then
      fail(422, why, "idempotency_key")
    end
    if why ~= "done" then
      local value = body.value
      if lease.value then
        value = check(lease.value, value, "value")
      end
      lease.write(target, value)
      self.ledger:applied(key, run, id)
    end
    return 200, json.object({})
  end

  function Module:_lease_restore(body)
    local lease, target, key, run, id = self:_lease_write(body)
    if self.ledger:may_restore(key, run, id) then
      lease.write(target, body.value)
      self.ledger:restored(key, id)
    end
    return 200, json.object({})
  end

  local routes = {
    [protocol.paths.dispatch] = Module._dispatch,
    [protocol.paths.revert] = Module._revert,
    [protocol.paths.inspect] = Module._inspect,
    [protocol.paths.tagged] = Module._tagged,
    [protocol.paths.lease_read] = Module._lease_read,
    [protocol.paths.lease_apply] = Module._lease_apply,
    [protocol.paths.lease_restore] = Module._lease_restore,
  }

  -- Answer one call: a status and a body, as a push server would.
  function Module:handle(path, body)
    local route = routes[path]
    if route == nil then
      return 404, protocol.error_body("no such path: " .. tostring(path), "path")
    end
    if type(body) ~= "table" or json.is_array(body) then
      return 400, protocol.error_body("malformed request: the body should be a JSON object")
    end
    local ok, status, answer = pcall(route, self, body)
    if ok then
      return status, answer
    end
    local err = status
    if type(err) == "table" and err.roadie and err.body then
      return err.status, err.body
    elseif type(err) == "table" and err.roadie then
      return err.status, protocol.error_body(err.message, err.field, err.retryable)
    end
    return 500, protocol.error_body("unexpected: " .. tostring(err), nil, true)
  end

  return M
end
