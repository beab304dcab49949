-- Roadie for Luanti: this server becomes a Roadie module over the pull transport. It polls
-- the gateway named by `roadie.gateway_url` for calls, carries each out in the game loop,
-- and posts the answer back; see docs/integrations/luanti.md.
local modpath = minetest.get_modpath("roadie")
local sdk = dofile(modpath .. "/sdk/init.lua")(modpath .. "/sdk")
local json = sdk.json

local function log(level, message)
  minetest.log(level, message)
end

local http = minetest.request_http_api()
if http == nil then
  error("roadie: this mod needs HTTP: add it to secure.http_mods (secure.http_mods = roadie)")
end

local settings = minetest.settings
local worldpath = minetest.get_worldpath()

-- One secret, or several whsec_ ones separated by spaces (or lines, in the file) while one
-- is rotated; sdk.protocol.secret_list says which.
local function read_secrets()
  local file = settings:get("roadie.secret_file")
  if file and file ~= "" then
    local path = file:sub(1, 1) == "/" and file or (worldpath .. "/" .. file)
    local f = io.open(path, "r")
    if f == nil then
      error("roadie: cannot read roadie.secret_file " .. path)
    end
    local text = f:read("*a") or ""
    f:close()
    return text
  end
  return settings:get("roadie.secret") or ""
end

local text = read_secrets()
if not text:find("%S") then
  error("roadie: no secret: set roadie.secret_file (a file in the world folder) or roadie.secret")
end
local secrets, why = sdk.protocol.secret_list(text)
if secrets == nil then
  error("roadie: " .. why .. " (roadie.secret or roadie.secret_file)")
end

-- Random bytes for request ids: the system's when Luanti can reach them, else PCG seeded from
-- the microsecond clock (math.random alone is seeded with whole seconds at start, which two
-- servers started together, or a restart within the second, would share).
local random
local secure = rawget(_G, "SecureRandom") and SecureRandom()
if secure then
  random = function(n)
    return secure:next_bytes(n)
  end
else
  local pcg = PcgRandom(minetest.get_us_time() + math.random(0, 2 ^ 30))
  random = function(n)
    local out = {}
    for i = 1, n do
      out[i] = string.char(pcg:next(0, 255))
    end
    return table.concat(out)
  end
end

-- The key ledger, fence marks included, lives in the world folder, appended to and flushed
-- before each answer leaves: mod storage and the map are saved only every few seconds, and
-- a server killed in between would forget answers it had already given, or take a call of
-- an owner superseded before the kill.
local journal_path = worldpath .. "/roadie_ledger.jsonl"
local journal
local store = {
  load = function()
    local f = io.open(journal_path, "r")
    if f == nil then
      return nil
    end
    local text = f:read("*a")
    f:close()
    return text
  end,
  append = function(line)
    journal:write(line)
    journal:flush()
  end,
  replace = function(text)
    if journal then
      journal:close()
    end
    if not minetest.safe_file_write(journal_path, text) then
      error("roadie: cannot write " .. journal_path)
    end
    journal = assert(io.open(journal_path, "a"))
  end,
}
local ledger = sdk.ledger.open(store)
if ledger.skipped > 0 then
  log("warning", string.format("roadie: %d damaged line(s) in %s were skipped", ledger.skipped, journal_path))
end

local poller
local function report(key, resources, done)
  poller:report(key, resources, done)
end

local world = dofile(modpath .. "/world.lua")(sdk, ledger, report, log)
local module = sdk.module.new({
  name = settings:get("roadie.module") or "luanti",
  description = "A Luanti world (" .. (minetest.get_game_info and minetest.get_game_info().id or "game")
    .. "): creatures, nodes, chat, the time of day and settings",
  actions = world.actions,
  leases = world.leases,
  revert = world.revert,
  inspect = world.inspect,
  tagged = world.tagged,
  find = world.find,
  ledger = ledger,
})

poller = sdk.poll.new({
  url = settings:get("roadie.gateway_url") or "http://127.0.0.1:7300",
  module = module.def.name,
  secrets = secrets,
  manifest = module:manifest(),
  wait = tonumber(settings:get("roadie.wait")) or 15,
  handle = function(path, body)
    return module:handle(path, body)
  end,
  http = function(request, done)
    http.fetch({
      url = request.url,
      method = "POST",
      data = request.data,
      extra_headers = request.headers,
      timeout = request.timeout,
    }, function(result)
      done({ok = result.succeeded, code = result.code, data = result.data, timeout = result.timeout})
    end)
  end,
  now = os.time,
  random = random,
  after = minetest.after,
  log = log,
})

-- Start once the world is running (the entity and node APIs are not ready at load time).
minetest.after(0, function()
  poller:start()
end)
minetest.register_on_shutdown(function()
  poller:stop()
  if journal then
    journal:close()
    journal = nil
  end
end)

roadie = {sdk = sdk, module = module, poller = poller, ledger = ledger, json = json}
