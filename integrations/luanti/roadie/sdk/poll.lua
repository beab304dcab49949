-- The pull transport (docs/protocol.md §5): announce, long-poll the engine's gateway,
-- carry out each call through a module and post its answer back. It makes only outgoing
-- HTTP requests, through a function the host gives it, so it runs in any Lua host.
--
-- opts = {
--   url = "http://gateway:7300",  module = "luanti",
--   secrets = "whsec_...",                   -- several while one is rotated: a list, or
--                                            -- separated by spaces (`secret` works too)
--   manifest = {...},                        -- what announce says
--   handle = function(path, body) return status, body end,
--   http = function(request, done) end,      -- request: {url, data, headers, timeout};
--                                            -- done({ok, code, data}) once, later
--   now = function() return unix_seconds end,
--   random = function(n) return bytes end,   -- optional: n random bytes, for request ids
--                                            -- (else math.random: see protocol.new_id)
--   after = function(seconds, fn) end,
--   log = function(level, message) end,      -- never given a secret
--   max = 16, wait = 20,
-- }
return function(sdk)
  local json, protocol = sdk.json, sdk.protocol
  local paths = protocol.paths
  local M = {}
  local Poller = {}
  Poller.__index = Poller

  local ANSWER_TRIES = 6

  function M.new(opts)
    local self = setmetatable({}, Poller)
    for name, value in pairs(opts) do
      self[name] = value
    end
    self.url = self.url:gsub("/+$", "")
    local secrets, why = protocol.secret_list(self.secrets or self.secret)
    if secrets == nil then
      error("roadie: " .. why, 2)
    end
    self.secrets, self.secret = secrets, nil
    self.max = self.max or 16
    self.wait = self.wait or 20
    self.failures = 0
    self.stopped = false
    self.polls = 0 -- answered polls, for tests and logs
    self.carried = 0 -- calls carried out
    return self
  end

  -- Every request goes out under an id of its own, retries included: the gateway refuses
  -- an id it has seen, as a replay.
  function Poller:_headers(path, data, key)
    return protocol.headers(self.secrets, self.module, path, data, self.now(), key, protocol.new_id(self.random))
  end

  function Poller:_post(path, body, key, done)
    local data = json.encode(body)
    self.http({
      url = self.url .. path,
      data = data,
      headers = self:_headers(path, data, key),
      -- a client timeout longer than the poll's wait, or every empty poll is an error
      timeout = self.wait + 10,
    }, done)
  end

  -- After a failure: wait (exponentially longer, with jitter, at most 30 s), then announce
  -- again, which also finds a gateway that came back with a new store.
  function Poller:_retry(why)
    self.failures = self.failures + 1
    local delay = math.min(30, 0.5 * 2 ^ math.min(self.failures - 1, 6)) * (0.5 + math.random() / 2)
    self.log(self.failures == 1 and "warning" or "info",
      string.format("roadie: %s; again in %.1fs", why, delay))
    self.after(delay, function()
      self:_announce()
    end)
  end

  function Poller:start()
    self:_announce()
  end

  function Poller:stop()
    self.stopped = true
  end

  function Poller:_announce()
    if self.stopped then
      return
    end
    self:_post(paths.announce, self.manifest, nil, function(result)
      if result.ok and result.code == 200 then
        self.log("action", "roadie: announced to " .. self.url)
        self:_poll()
      else
        self:_retry(string.format("announce failed (%s)", M.describe(result)))
      end
    end)
  end

  function Poller:_poll()
    if self.stopped then
      return
    end
    local ask = json.object({max = self.max, wait = self.wait})
    local data = json.encode(ask)
    local headers, id = self:_headers(paths.pull, data, nil)
    headers[#headers + 1] = "X-Roadie-Features: delivery-token, signed-body"
    self.http({url = self.url .. paths.pull, data = data, headers = headers, timeout = self.wait + 10},
      function(result)
        if not (result.ok and result.code == 200) then
          return self:_retry(string.format("poll failed (%s)", M.describe(result)))
        end
        local answer, why = protocol.open_signed(self.secrets, id, paths.pull, result.data or "", self.now())
        if answer == nil then
          -- Carry out nothing the engine did not sign for this poll: anyone on the way could
          -- have written it, or kept an answer to an earlier one.
          return self:_retry("poll answer refused: " .. why)
        end
        self.failures = 0
        self.polls = self.polls + 1
        for _, call in ipairs(type(answer.calls) == "table" and answer.calls or {}) do
          self:_carry(call)
        end
        self:_poll()
      end)
  end

  function Poller:_carry(call)
    local status, body = self.handle(call.path, call.body)
    self.carried = self.carried + 1
    local posted = json.object({id = call.id, status = status, body = body})
    if call.token ~= nil and call.token ~= json.null then
      posted.token = call.token
    end
    self:_send_answer(posted, 1)
  end

  -- An answer lost on the way is no harm (the call comes back after its visibility
  -- timeout, and the key ledger answers it again), but it costs that wait: retry a little.
  function Poller:_send_answer(posted, try)
    self:_post(paths.answer, posted, nil, function(result)
      if result.ok and result.code == 200 then
        return
      end
      if try < ANSWER_TRIES and not self.stopped then
        self.after(0.25 * 2 ^ (try - 1), function()
          self:_send_answer(posted, try + 1)
        end)
      else
        self.log("warning", string.format("roadie: the answer to call %s was not delivered (%s)",
          tostring(posted.id), M.describe(result)))
      end
    end)
  end

  -- Resources a step's effect made by itself, reported against its key (§5, report).
  -- `done(recorded, rejected)` is called once it is through, or given up.
  function Poller:report(key, resources, done, try)
    try = try or 1
    local body = json.object({idempotency_key = key, resources = json.array(resources)})
    self:_post(paths.report, body, key, function(result)
      if result.ok and result.code == 200 then
        local answer = json.decode(result.data or "") or {}
        return done and done(answer.recorded or 0, answer.rejected or {})
      end
      local retry = not result.ok or result.code >= 500 or result.code == 429
      if retry and try < ANSWER_TRIES and not self.stopped then
        return self.after(0.5 * 2 ^ (try - 1), function()
          self:report(key, resources, done, try + 1)
        end)
      end
      self.log("warning", string.format("roadie: late resources of %s not reported (%s)", key, M.describe(result)))
      return done and done(0, {M.describe(result)})
    end)
  end

  -- One line about a failed request, with the engine's message when it sent one.
  function M.describe(result)
    if not result.ok then
      return result.timeout and "timed out" or "no answer"
    end
    local body = json.decode(result.data or "")
    local message = type(body) == "table" and type(body.error) == "table" and body.error.message
    return "HTTP " .. tostring(result.code) .. (message and (": " .. message) or "")
  end

  return M
end
