-- The remote module protocol, version 1 (docs/protocol.md): paths, signing, error bodies.
-- Pure Lua; needs only the SDK's sha256 and json.
return function(sdk)
  local sha256, json = sdk.sha256, sdk.json
  local M = {
    VERSION = "roadie/v1",
    MAX_SKEW = 300, -- seconds a signed message may be away from our clock
    ANSWER_METHOD = "ANSWER", -- in the method's place when the engine signs an answer
  }

  local prefix = "/roadie/v1"
  M.paths = {
    announce = prefix .. "/announce",
    pull = prefix .. "/pull",
    answer = prefix .. "/answer",
    report = prefix .. "/report",
    dispatch = prefix .. "/dispatch",
    revert = prefix .. "/revert",
    inspect = prefix .. "/inspect",
    tagged = prefix .. "/tagged",
    lease_read = prefix .. "/lease/read",
    lease_apply = prefix .. "/lease/apply",
    lease_restore = prefix .. "/lease/restore",
  }

  -- METHOD \n PATH \n TIMESTAMP \n BODY, HMAC-SHA256 with the module's secret, in hex.
  function M.signature(secret, method, path, timestamp, body)
    return "v1=" .. sha256.hmac_hex(secret, method .. "\n" .. path .. "\n" .. timestamp .. "\n" .. body)
  end

  -- The headers of a request the module sends, as "Name: value" lines.
  function M.headers(secret, module, path, body, now, key)
    local timestamp = string.format("%d", now)
    return {
      "Content-Type: application/json",
      "X-Roadie-Module: " .. module,
      "X-Roadie-Key: " .. (key or "-"),
      "X-Roadie-Timestamp: " .. timestamp,
      "X-Roadie-Signature: " .. M.signature(secret, "POST", path, timestamp, body),
    }
  end

  -- The answer inside a signed body ({"timestamp", "signature", "answer"}), decoded,
  -- or nil and why: nothing is carried out from an answer the engine did not sign.
  function M.open_signed(secret, path, raw, now)
    local envelope, err = json.decode(raw)
    if envelope == nil then
      return nil, "unsigned answer: " .. err
    end
    if type(envelope) ~= "table" or type(envelope.answer) ~= "string"
        or type(envelope.timestamp) ~= "string" or type(envelope.signature) ~= "string" then
      return nil, "unsigned answer: no timestamp, signature and answer in its body"
    end
    local sent = tonumber(envelope.timestamp)
    if sent == nil then
      return nil, "unsigned answer: its timestamp is not Unix seconds"
    end
    if math.abs(now - sent) > M.MAX_SKEW then
      return nil, string.format("stale answer: %ds away from this clock", math.abs(now - sent))
    end
    local expected = M.signature(secret, M.ANSWER_METHOD, path, envelope.timestamp, envelope.answer)
    if not sha256.equal(expected, envelope.signature) then
      return nil, "wrongly signed answer: not made with this module's secret"
    end
    local answer, why = json.decode(envelope.answer)
    if answer == nil then
      return nil, "unreadable answer: " .. why
    end
    return answer
  end

  function M.error_body(message, field, retryable)
    local inner = json.object({message = message, retryable = retryable and true or false})
    if field ~= nil then
      inner.field = field
    end
    return json.object({error = inner})
  end

  return M
end
