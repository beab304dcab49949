-- What this mod does to a Luanti world, as a Roadie module: its actions, leases, and how
-- it finds, inspects and takes back what it made. Everything it makes carries the key of
-- the step that made it (an entity's static data, a node's metadata), checked before any
-- revert, so that an id or position reused after a crash never makes it remove another's.
return function(sdk, ledger, report, log)
  local json = sdk.json
  local fail = sdk.module.fail
  local TAG = "roadie:key" -- the node metadata field that holds a placed node's key

  -- Positions ---------------------------------------------------------------------------

  local function round(pos)
    return {x = math.floor(pos.x + 0.5), y = math.floor(pos.y + 0.5), z = math.floor(pos.z + 0.5)}
  end

  local function pos_ref(pos)
    return string.format("%d,%d,%d", pos.x, pos.y, pos.z)
  end

  local function ref_pos(ref)
    local x, y, z = ref:match("^(-?%d+),(-?%d+),(-?%d+)$")
    if x == nil then
      return nil
    end
    return {x = tonumber(x), y = tonumber(y), z = tonumber(z)}
  end

  local function block_of(pos)
    return {x = math.floor(pos.x / 16), y = math.floor(pos.y / 16), z = math.floor(pos.z / 16)}
  end

  -- The node at pos; nil when its block is not in memory, after asking for it to be loaded
  -- from disk, or generated (never `load_area`, which makes blank blocks of what was never
  -- generated): the caller answers 503, and the retry finds it.
  local function node_at(pos)
    local node = minetest.get_node_or_nil(pos)
    if node == nil or node.name == "ignore" then
      minetest.emerge_area(pos, pos)
      return nil
    end
    return node
  end

  -- Keeping blocks active -------------------------------------------------------------------
  -- With no player near, no block is active and no entity in it can be found; a block
  -- becomes active only at the server's next active-block pass (active_block_mgmt_interval,
  -- 2 s by default) after it is force-loaded. So a block holding a creature of ours stays
  -- force-loaded while the creature lives and for KEEP seconds after its revert, when a
  -- verification may look for it (again after a restart, from the ledger: a crash can bring
  -- back what was reverted); a block an inspect or revert needs is loaded for a minute.
  local KEEP = 600

  local holds = {}

  local function hold(pos)
    local id = pos_ref(block_of(pos))
    holds[id] = (holds[id] or 0) + 1
    if holds[id] == 1 then
      minetest.forceload_block(pos, true)
    end
  end

  local function release(pos)
    local id = pos_ref(block_of(pos))
    if holds[id] == nil then
      return
    end
    holds[id] = holds[id] - 1
    if holds[id] <= 0 then
      holds[id] = nil
      minetest.forceload_free_block(pos, true)
    end
  end

  local function active(pos)
    return minetest.compare_block_status(pos, "active") == true
  end

  -- Make pos's block active for a minute; true when it already is.
  local function visit(pos)
    if active(pos) then
      return true
    end
    hold(pos)
    minetest.after(60, release, pos)
    return false
  end

  -- Creatures ---------------------------------------------------------------------------

  local creatures = {} -- ref -> ObjectRef, for the entities of ours that are active now

  local function creature(ref)
    local object = creatures[ref]
    if object ~= nil and object:get_pos() == nil then
      creatures[ref] = nil -- removed since
      return nil
    end
    return object
  end

  local function new_ref()
    local next_id = ledger:get("next_id") or 1
    ledger:set("next_id", next_id + 1)
    return string.format("c%d", next_id)
  end

  local spawn_creature -- defined after the entity, which spawns minions with it

  -- The ledger's word on a creature: {key, pos, summoned?, reverted?}, or nil.
  local function known_creature(ref)
    return ledger:get("creature:" .. ref)
  end

  local function note_creature(ref, changes)
    local entry = json.object({})
    for name, value in pairs(known_creature(ref) or {}) do
      entry[name] = value
    end
    for name, value in pairs(changes) do
      entry[name] = value
    end
    ledger:set("creature:" .. ref, entry)
  end

  -- A creature of ours is gone: its block stays loaded a while for a verification.
  local function gone(ref)
    local entry = known_creature(ref)
    if entry and not entry.reverted then
      note_creature(ref, {reverted = os.time()})
      minetest.after(KEEP, release, entry.pos)
    end
  end

  minetest.register_entity("roadie:creature", {
    initial_properties = {
      physical = false,
      collide_with_objects = false,
      visual = "upright_sprite",
      textures = {"roadie_creature.png", "roadie_creature.png"},
      static_save = true,
      nametag_color = "#ffd27f",
    },
    on_activate = function(self, staticdata)
      local data = json.decode(staticdata or "")
      if type(data) ~= "table" or type(data.ref) ~= "string" then
        self.object:remove() -- not one of ours any more: a creature without its tag
        return
      end
      self.roadie = data
      creatures[data.ref] = self.object
      self.object:set_properties({nametag = data.kind})
    end,
    get_staticdata = function(self)
      return json.encode(json.object(self.roadie or {}))
    end,
    on_deactivate = function(self)
      if self.roadie and creatures[self.roadie.ref] == self.object then
        creatures[self.roadie.ref] = nil
      end
    end,
    on_step = function(self, dtime)
      local data = self.roadie
      if data == nil or (data.summons or 0) <= 0 or self.summoned then
        return
      end
      self.age = (self.age or 0) + dtime
      if self.age < (data.summon_after or 1) then
        return
      end
      -- Only once, and only while the creature is live in the ledger (one that a crash
      -- brought back after its revert summons nothing): its static data is saved only
      -- when it is deactivated, so the ledger is what remembers.
      self.summoned = true
      local entry = known_creature(data.ref)
      if entry == nil or entry.reverted or entry.summoned then
        return
      end
      note_creature(data.ref, {summoned = true})
      -- It summons others by itself: no answer names them, so they are reported late.
      local at = self.object:get_pos()
      local made = {}
      for i = 1, data.summons do
        local pos = {x = at.x + i, y = at.y, z = at.z}
        local resource = spawn_creature(data.key, pos, data.kind .. " minion", {summoned_by = data.ref})
        if resource then
          made[#made + 1] = resource
        end
      end
      if #made > 0 then
        report(data.key, made, function(recorded, rejected)
          if recorded < #made then
            -- Refused (the run is being cleaned up already): take them down ourselves.
            log("warning", string.format("roadie: %d late creature(s) of %s refused (%s); removing them",
              #made - recorded, data.key, json.encode(rejected)))
            for _, r in ipairs(made) do
              local object = creature(r.ref)
              if object then
                object:remove()
              end
              gone(r.ref)
            end
          end
        end)
      end
    end,
  })

  function spawn_creature(key, pos, kind, extra)
    local ref = new_ref()
    local data = json.object({key = key, ref = ref, kind = kind})
    for name, value in pairs(extra or {}) do
      data[name] = value
    end
    local object = minetest.add_entity(pos, "roadie:creature", json.encode(data))
    if object == nil then
      return nil
    end
    local at = round(pos)
    ledger:set("creature:" .. ref, json.object({key = key, pos = at}))
    hold(at)
    return json.object({kind = "creature", ref = ref, payload = json.object({kind = kind, pos = at})})
  end

  local function creature_pos(ref)
    local known = known_creature(ref)
    return known and known.pos or nil
  end

  -- Nodes -------------------------------------------------------------------------------

  local function snapshot(pos, node)
    local meta = minetest.get_meta(pos):to_table() or {}
    local inventory = json.object({})
    for list, stacks in pairs(meta.inventory or {}) do
      local items = json.array({})
      for i, stack in ipairs(stacks) do
        items[i] = type(stack) == "string" and stack or stack:to_string()
      end
      inventory[list] = items
    end
    return json.object({name = node.name, param1 = node.param1, param2 = node.param2,
      fields = json.object(meta.fields or {}), inventory = inventory})
  end

  local function put_back(pos, previous)
    minetest.set_node(pos, {name = previous.name, param1 = previous.param1, param2 = previous.param2})
    local inventory = {}
    for list, items in pairs(previous.inventory or {}) do
      inventory[list] = {}
      for i, item in ipairs(items) do
        inventory[list][i] = item
      end
    end
    local fields = {}
    for name, value in pairs(previous.fields or {}) do
      fields[name] = value
    end
    minetest.get_meta(pos):from_table({fields = fields, inventory = inventory})
  end

  -- Who holds the change at pos: the key in a placed node's metadata or, for a hole (Luanti
  -- keeps no metadata on air), the key the ledger recorded for it, reverted lately or not.
  local function holder(pos, ref, lately)
    local tag = minetest.get_meta(pos):get_string(TAG)
    if tag ~= "" then
      return tag
    end
    local entry = ledger:get("node:" .. ref)
    if entry and entry.kind == "dug" and (lately or not entry.reverted) and minetest.get_node(pos).name == "air" then
      return entry.key
    end
    return nil
  end

  -- Set pos to `name` under key, saving what was there; the resource. A position this key
  -- changed already (an earlier attempt that stopped half-way) keeps what it saved then.
  local function change_node(key, pos, name, kind)
    local ref = pos_ref(pos)
    local owner = holder(pos, ref)
    local entry = ledger:get("node:" .. ref)
    if owner == key and entry and entry.key == key and not entry.reverted then
      return json.object({kind = entry.kind, ref = ref, payload = entry.payload})
    elseif owner ~= nil then
      fail(422, string.format("%s is held by another step's change (%s); not changed", ref, owner), "params")
    end
    local previous = snapshot(pos, minetest.get_node(pos))
    minetest.set_node(pos, {name = name})
    if kind == "node" then
      minetest.get_meta(pos):set_string(TAG, key)
    end
    local payload = json.object({node = name, previous = previous})
    ledger:set("node:" .. ref, json.object({key = key, kind = kind, payload = payload}))
    return json.object({kind = kind, ref = ref, payload = payload})
  end

  -- Every position loaded (else 503, and they are being loaded) before any is changed.
  local function change_nodes(key, list, name, kind)
    local missing = {}
    for _, pos in ipairs(list) do
      if node_at(pos) == nil then
        missing[#missing + 1] = pos_ref(pos)
      end
    end
    if #missing > 0 then
      fail(503, "loading or generating " .. table.concat(missing, " ", 1, math.min(#missing, 5)) .. "; try again",
        "params", true)
    end
    local made = json.array({})
    for _, pos in ipairs(list) do
      -- Digging air makes nothing (and would leave nothing to tell it apart by).
      if kind ~= "dug" or minetest.get_node(pos).name ~= "air" or holder(pos, pos_ref(pos)) == key then
        made[#made + 1] = change_node(key, pos, name, kind)
      end
    end
    return made
  end

  local function positions(params)
    local list, seen = {}, {}
    for _, p in ipairs(params.positions) do
      local pos = round(p)
      if not seen[pos_ref(pos)] then
        seen[pos_ref(pos)] = true
        list[#list + 1] = pos
      end
    end
    return list
  end

  -- Reverting and inspecting ---------------------------------------------------------------

  local function revert_one(key, r, later)
    if r.kind == "creature" then
      local object = creature(r.ref)
      if object ~= nil then
        local data = object:get_luaentity() and object:get_luaentity().roadie
        if data == nil or data.key ~= key then
          return -- tagged with another key: not ours to remove
        end
        object:remove()
        creatures[r.ref] = nil
      else
        local pos = creature_pos(r.ref) or (type(r.payload) == "table" and r.payload.pos)
        if pos and not visit(pos) then
          later[#later + 1] = r.ref -- its block is loading: found on the next try
          return
        end
      end
      local known = known_creature(r.ref)
      if known and known.key == key then
        gone(r.ref)
      end
    elseif r.kind == "node" or r.kind == "dug" then
      local pos = ref_pos(r.ref)
      if pos == nil then
        return -- never a position of ours
      end
      if node_at(pos) == nil then
        later[#later + 1] = r.ref
        return
      end
      local known = ledger:get("node:" .. r.ref)
      local payload = type(r.payload) == "table" and r.payload.previous and r.payload
        or (known and known.key == key and known.payload)
      if holder(pos, r.ref, true) == key and payload then
        put_back(pos, payload.previous)
      end
      if known and known.key == key and not known.reverted then
        if known.kind == "dug" then
          -- The ledger is a hole's only tag: kept a while, for a verification after a crash.
          ledger:set("node:" .. r.ref, json.object({key = key, kind = "dug", payload = known.payload,
            reverted = os.time()}))
        else
          ledger:set("node:" .. r.ref, nil)
        end
      end
    end
  end

  local function revert(key, resources)
    local later = {}
    for _, r in ipairs(resources) do
      revert_one(key, r, later)
    end
    if #later > 0 then
      fail(503, "loading the area of " .. table.concat(later, ", ", 1, math.min(#later, 5)) .. "; try again",
        "resources", true)
    end
    return {}
  end

  local function inspect(kind, ref, key)
    if kind == "creature" then
      local object = creature(ref)
      if object == nil then
        local pos = creature_pos(ref)
        if pos and not visit(pos) then
          fail(503, "loading the area of " .. ref .. "; try again", "resources", true)
        end
        return false, false
      end
      local data = object:get_luaentity() and object:get_luaentity().roadie
      return true, data ~= nil and data.key == key
    elseif kind == "node" or kind == "dug" then
      local pos = ref_pos(ref)
      if pos == nil then
        return false, false
      end
      if node_at(pos) == nil then
        fail(503, "loading the area of " .. ref .. "; try again", "resources", true)
      end
      local owner = holder(pos, ref, true)
      return owner ~= nil, owner == key
    end
    return false, false
  end

  -- Everything the world holds tagged with a key: active creatures, and the nodes of ours.
  local function tagged()
    local objects = {}
    for ref in pairs(creatures) do
      local object = creature(ref)
      local data = object and object:get_luaentity() and object:get_luaentity().roadie
      if data then
        objects[#objects + 1] = {kind = "creature", ref = ref, key = data.key,
          payload = json.object({kind = data.kind, pos = round(object:get_pos())})}
      end
    end
    for name, known in pairs(ledger.state.data) do
      local ref = name:match("^node:(.*)$")
      if ref and not known.reverted then
        local pos = ref_pos(ref)
        if node_at(pos) and holder(pos, ref) == known.key then
          objects[#objects + 1] = {kind = known.kind, ref = ref, key = known.key, payload = known.payload}
        end
      end
    end
    return objects
  end

  local function find(key)
    local mine = {}
    for _, o in ipairs(tagged()) do
      if o.key == key then
        mine[#mine + 1] = json.object({kind = o.kind, ref = o.ref, payload = o.payload})
      end
    end
    -- Creatures in blocks not active now are not in `tagged`: the ledger knows them.
    for name, known in pairs(ledger.state.data) do
      local ref = name:match("^creature:(.*)$")
      if ref and known.key == key and not known.reverted and creature(ref) == nil then
        mine[#mine + 1] = json.object({kind = "creature", ref = ref, payload = json.object({pos = known.pos})})
      end
    end
    return mine
  end

  -- At start (once the world runs: force-loading does nothing before), keep loaded the
  -- blocks of the creatures the ledger says are live or were reverted lately; forget the rest.
  minetest.after(0, function()
    local now = os.time()
    for name, known in pairs(ledger.state.data) do
      local old = type(known) == "table" and known.reverted and now - known.reverted >= KEEP
      if name:match("^node:") and old then
        ledger:set(name, nil)
      elseif name:match("^creature:") then
        if not known.reverted then
          hold(known.pos)
        elseif now - known.reverted < KEEP then
          hold(known.pos)
          minetest.after(KEEP - (now - known.reverted), release, known.pos)
        else
          ledger:set(name, nil)
        end
      end
    end
  end)

  -- Schemas -----------------------------------------------------------------------------

  local pos_schema = json.object({type = "object", required = json.array({"x", "y", "z"}),
    properties = json.object({x = json.object({type = "number"}), y = json.object({type = "number"}),
      z = json.object({type = "number"})}),
    additionalProperties = false})
  local positions_schema = json.object({type = "array", items = pos_schema, minItems = 1, maxItems = 256,
    description = "where, e.g. [{\"x\": 0, \"y\": 8, \"z\": 0}]",
    examples = json.array({json.array({json.object({x = 0, y = 8, z = 0})})})})
  local function params(properties, required)
    return json.object({type = "object", additionalProperties = false, properties = json.object(properties),
      required = json.array(required)})
  end

  local allowed_settings = {}
  for name in (minetest.settings:get("roadie.lease_settings")
      or "time_speed,motd,enable_pvp,enable_damage"):gmatch("[^,%s]+") do
    allowed_settings[name] = true
  end

  local actions = {
    spawn = {
      order = 1, -- listed first: the kit tests with it (each key makes its own, at one place)
      reversible = "ledger",
      description = "Spawn creatures around a position, each tagged with the step's key; "
        .. "with `summons`, each summons minions of its own after `summon_after` seconds (reported late).",
      params = params({
        pos = json.object({type = "object", required = json.array({"x", "y", "z"}),
          properties = pos_schema.properties, additionalProperties = false,
          description = "where, e.g. {\"x\": 0, \"y\": 8, \"z\": 0}",
          examples = json.array({json.object({x = 0, y = 8, z = 0})})}),
        kind = json.object({type = "string", minLength = 1, maxLength = 64, default = "creature",
          description = "what it is called in the world, e.g. zombie"}),
        count = json.object({type = "integer", minimum = 1, maximum = 100, default = 1}),
        spread = json.object({type = "integer", minimum = 0, maximum = 16, default = 2}),
        summons = json.object({type = "integer", minimum = 0, maximum = 10, default = 0}),
        summon_after = json.object({type = "number", minimum = 0, maximum = 3600, default = 1}),
      }, {"pos"}),
      run = function(p, key)
        local centre = round(p.pos)
        if node_at(centre) == nil then
          fail(503, "the world has not generated " .. pos_ref(centre) .. " yet; it is being generated", "params", true)
        end
        if not visit(centre) then
          fail(503, "loading the area around " .. pos_ref(centre) .. "; try again", "params", true)
        end
        local made, refs = json.array({}), json.array({})
        for i = 1, p.count do
          local pos = {x = centre.x + (i - 1) % (2 * p.spread + 1) - p.spread, y = centre.y,
            z = centre.z + math.floor((i - 1) / (2 * p.spread + 1)) % (2 * p.spread + 1) - p.spread}
          local extra = p.summons > 0 and {summons = p.summons, summon_after = p.summon_after} or nil
          local resource = spawn_creature(key, pos, p.kind, extra)
          if resource == nil then
            fail(503, "the world refused a creature at " .. pos_ref(round(pos)), "params", true)
          end
          made[#made + 1] = resource
          refs[#refs + 1] = resource.ref
        end
        return made, json.object({refs = refs})
      end,
    },
    place = {
      reversible = "ledger",
      description = "Place a node at each position, saving the node it replaces (with its metadata).",
      params = params({
        node = json.object({type = "string", minLength = 1, description = "a registered node, e.g. air",
          examples = json.array({"air"})}),
        positions = positions_schema,
      }, {"node", "positions"}),
      run = function(p, key)
        if minetest.registered_nodes[p.node] == nil then
          fail(422, "params.node: no node '" .. p.node .. "' is registered in this game", "params.node")
        end
        local made = change_nodes(key, positions(p), p.node, "node")
        return made, json.object({placed = #made})
      end,
    },
    dig = {
      reversible = "ledger",
      description = "Remove the node at each position (it becomes air), saving it to be put back.",
      params = params({positions = positions_schema}, {"positions"}),
      run = function(p, key)
        local made = change_nodes(key, positions(p), "air", "dug")
        return made, json.object({dug = #made})
      end,
    },
    announce = {
      reversible = "none",
      description = "Say a message in chat to everyone.",
      params = params({message = json.object({type = "string", minLength = 1, maxLength = 500,
        examples = json.array({"The invasion begins!"})})}, {"message"}),
      run = function(p)
        minetest.chat_send_all(p.message)
        return {}, json.object({players = #minetest.get_connected_players()})
      end,
    },
    effect = {
      reversible = "self",
      description = "Make every player online faster for a while; it wears off by itself.",
      params = params({
        speed = json.object({type = "number", minimum = 0.1, maximum = 5, default = 2}),
        seconds = json.object({type = "number", minimum = 1, maximum = 3600, default = 60}),
      }, {}),
      run = function(p)
        local names = json.array({})
        for _, player in ipairs(minetest.get_connected_players()) do
          local name = player:get_player_name()
          player:set_physics_override({speed = p.speed})
          minetest.after(p.seconds, function()
            local still = minetest.get_player_by_name(name)
            if still then
              still:set_physics_override({speed = 1})
            end
          end)
          names[#names + 1] = name
        end
        return {}, json.object({players = names})
      end,
    },
  }

  local function time_of_day()
    -- The world keeps the time of day in 1/24000ths: read on that grid, so that a value
    -- written reads back the same.
    return math.floor(minetest.get_timeofday() * 24000 + 0.5) / 24000
  end

  local leases = {
    time_of_day = {
      targeted = false,
      description = "The time of day, 0 to 1 (0.5 is noon), on a grid of 1/24000. "
        .. "While time_speed is not 0 the clock moves on from what was written.",
      value = json.object({type = "number", minimum = 0, maximum = 1, examples = json.array({0.5, 0})}),
      read = time_of_day,
      write = function(_, value)
        minetest.set_timeofday(value)
      end,
    },
    setting = {
      targeted = true,
      description = "A server setting (the target: its name), from those in roadie.lease_settings; "
        .. "null is unset.",
      value = json.object({type = "string", maxLength = 1000}),
      read = function(name)
        if not allowed_settings[name] then
          fail(422, "setting '" .. name .. "' is not in roadie.lease_settings", "target")
        end
        return minetest.settings:get(name)
      end,
      write = function(name, value)
        if not allowed_settings[name] then
          fail(422, "setting '" .. name .. "' is not in roadie.lease_settings", "target")
        end
        if value == nil or value == json.null then
          minetest.settings:remove(name)
        else
          minetest.settings:set(name, tostring(value))
        end
      end,
    },
  }

  return {actions = actions, leases = leases, revert = revert, inspect = inspect, tagged = tagged, find = find}
end
