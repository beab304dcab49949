-- A test's eyes inside the world. The test writes probe/request-ID.json in the world folder;
-- the next server step answers probe/answer-ID.json with what the world holds: the arena's
-- nodes (a hash, and the nodes tagged by Roadie), the Roadie creatures, the time of day
-- and the settings a run may borrow. It builds the arena the first time the world starts.
local worldpath = minetest.get_worldpath()
local dir = worldpath .. "/probe"
minetest.mkdir(dir)

local MIN, MAX = {x = -8, y = 0, z = -8}, {x = 8, y = 6, z = 8}
local CHEST = {x = 3, y = 1, z = 3}
local MAX_CORNER = {x = MAX.x, y = 0, z = MAX.z}

local function build_arena()
  -- Built once: the corner of the floor is one node no event of the tests touches.
  if minetest.get_node(MAX_CORNER).name == "default:stone" then
    return
  end
  for x = MIN.x, MAX.x do
    for z = MIN.z, MAX.z do
      minetest.set_node({x = x, y = 0, z = z}, {name = "default:stone"})
    end
  end
  minetest.set_node({x = -3, y = 1, z = -3}, {name = "default:tree"})
  minetest.set_node(CHEST, {name = "default:chest", param2 = 2})
  local inv = minetest.get_meta(CHEST):get_inventory()
  inv:set_stack("main", 1, "default:apple 5")
  inv:set_stack("main", 7, "default:mese_crystal 2")
  minetest.get_meta(CHEST):set_string("infotext", "The arena's chest")
end

local function look()
  local nodes, tagged, counts, solid = {}, {}, {}, {}
  for x = MIN.x, MAX.x do
    for y = MIN.y, MAX.y do
      for z = MIN.z, MAX.z do
        local pos = {x = x, y = y, z = z}
        local node = minetest.get_node(pos)
        local meta = minetest.get_meta(pos):to_table()
        local fields = {}
        for name, value in pairs(meta.fields or {}) do
          fields[#fields + 1] = name .. "=" .. value
        end
        table.sort(fields)
        local stacks = {}
        for list, items in pairs(meta.inventory or {}) do
          for i, stack in ipairs(items) do
            if not stack:is_empty() then
              stacks[#stacks + 1] = list .. i .. "=" .. stack:to_string()
            end
          end
        end
        table.sort(stacks)
        nodes[#nodes + 1] = string.format("%d,%d,%d:%s:%d:%s:%s", x, y, z, node.name, node.param2,
          table.concat(fields, ";"), table.concat(stacks, ";"))
        counts[node.name] = (counts[node.name] or 0) + 1
        if node.name ~= "air" then
          solid[x .. "," .. y .. "," .. z] = node.name
        end
        local key = minetest.get_meta(pos):get_string("roadie:key")
        if key ~= "" then
          tagged[#tagged + 1] = {pos = pos, key = key, name = node.name}
        end
      end
    end
  end
  local creatures = {}
  for _, entity in pairs(minetest.luaentities) do
    if entity.name == "roadie:creature" and entity.roadie then
      creatures[#creatures + 1] = {ref = entity.roadie.ref, key = entity.roadie.key, kind = entity.roadie.kind}
    end
  end
  local chest = {}
  for i, stack in ipairs(minetest.get_meta(CHEST):get_inventory():get_list("main") or {}) do
    if not stack:is_empty() then
      chest[#chest + 1] = i .. "=" .. stack:to_string()
    end
  end
  local polls = rawget(_G, "roadie") and roadie.poller.polls or 0
  return {
    arena = minetest.sha1(table.concat(nodes, "\n")),
    counts = counts,
    tagged = tagged,
    solid = solid,
    creatures = creatures,
    chest = chest,
    time_of_day = math.floor(minetest.get_timeofday() * 24000 + 0.5) / 24000,
    settings = {motd = minetest.settings:get("motd"), time_speed = minetest.settings:get("time_speed")},
    polls = polls,
  }
end

local arena_built = false
minetest.after(0, function()
  for _, corner in ipairs({MIN, MAX, {x = MIN.x, y = 0, z = MAX.z}, {x = MAX.x, y = 0, z = MIN.z}}) do
    minetest.forceload_block(corner, true)
  end
  minetest.emerge_area(MIN, MAX, function(_, _, remaining)
    if remaining == 0 then
      build_arena()
      arena_built = true
    end
  end)
end)

minetest.register_globalstep(function()
  if not arena_built then
    return
  end
  for _, name in ipairs(minetest.get_dir_list(dir, false)) do
    local id = name:match("^request%-(.+)%.json$")
    if id then
      minetest.safe_file_write(dir .. "/answer-" .. id .. ".json", minetest.write_json(look()))
      os.remove(dir .. "/" .. name)
    end
  end
end)
