-- The Roadie Lua SDK: dofile(dir .. "/init.lua")(dir) gives {sha256, base64, json, protocol,
-- ledger, module, poll}. Plain Lua 5.1 or LuaJIT; no `require`, so it loads inside a game's mod
-- sandbox (Luanti's has none) as well as from the command line.
return function(dir)
  local sdk = {}
  sdk.sha256 = dofile(dir .. "/sha256.lua")
  sdk.base64 = dofile(dir .. "/base64.lua")
  sdk.json = dofile(dir .. "/json.lua")
  for _, part in ipairs({"protocol", "ledger", "module", "poll"}) do
    sdk[part] = dofile(dir .. "/" .. part .. ".lua")(sdk)
  end
  return sdk
end
