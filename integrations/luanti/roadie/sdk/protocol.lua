-- The remote module protocol, version 2 (docs/protocol.md): paths, signing, fences, error bodies.
-- Pure Lua; needs only the SDK's sha256, base64 and json.
return function(sdk)
  local sha256, base64, json = sdk.sha256, sdk.base64, sdk.json
  local M = {
    VERSION = "roadie/v2",
    SUPERSEDED = 412, -- the answer to a call whose fence is older than one accepted for its target
    MAX_FENCE = 9007199254740991, -- 2^53 - 1: JSON readers that keep numbers as doubles keep it exactly
    MAX_SKEW = 300, -- seconds a signed message may be away from our clock
    ANSWER_METHOD = "ANSWER", -- in the method's place when an answer is signed
  }
  local SECRET_PREFIX = "whsec_"

  local prefix = "/roadie/v2"
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

  -- One secret, or several while one is rotated: a list, or one string of whsec_ secrets
  -- separated by whitespace (one setting can hold the new and the old). Any other string is
  -- one secret, spaces and all: split, a pass phrase would become several weak secrets.
  -- The list, or nil and why.
  function M.secret_list(secrets)
    local found = {}
    if type(secrets) == "string" then
      local all_whsec, any_whsec = true, false
      for secret in secrets:gmatch("%S+") do
        found[#found + 1] = secret
        all_whsec = all_whsec and secret:sub(1, 6) == "whsec_"
        any_whsec = any_whsec or secret:sub(1, 6) == "whsec_"
      end
      if any_whsec and not all_whsec then
        -- one pass phrase, or a rotation? Neither reading is safe to guess.
        return nil, "a whsec_ secret among other words: give whsec_ secrets alone, one plain secret, or a list"
      end
      if not all_whsec then
        local whole = secrets:match("^%s*(.-)%s*$")
        found = whole ~= "" and {whole} or {}
      end
    elseif type(secrets) == "table" then
      for _, secret in ipairs(secrets) do
        if type(secret) == "string" and secret ~= "" then
          found[#found + 1] = secret
        end
      end
    end
    if #found == 0 then
      return nil, "no secret given"
    end
    for _, secret in ipairs(found) do
      local key, why = M.secret_bytes(secret)
      if key == nil then
        return nil, why
      end
    end
    return found
  end

  -- The HMAC key of one secret: after "whsec_" (Standard Webhooks), the bytes its base64
  -- decodes to; any other string is its own bytes, so a plain secret set before still works.
  function M.secret_bytes(secret)
    if secret:sub(1, #SECRET_PREFIX) ~= SECRET_PREFIX then
      return secret
    end
    local key = base64.decode(secret:sub(#SECRET_PREFIX + 1))
    if key == nil or key == "" then
      return nil, "a whsec_ secret is base64 after its prefix" -- never the secret itself
    end
    return key
  end

  -- One "v1,<base64>" entry: HMAC-SHA256 keyed with the secret over
  -- ID.TIMESTAMP.METHOD PATH \n BODY (Standard Webhooks, with the request line bound in).
  function M.signature(secret, id, timestamp, method, path, body)
    local key = assert(M.secret_bytes(secret))
    local content = id .. "." .. timestamp .. "." .. method:upper() .. " " .. path .. "\n" .. body
    return "v1," .. base64.encode(sha256.hmac(key, content))
  end

  -- The webhook-signature header: one entry per secret, so either side may rotate first.
  function M.signatures(secrets, id, timestamp, method, path, body)
    local entries = {}
    for i, secret in ipairs(assert(M.secret_list(secrets))) do
      entries[i] = M.signature(secret, id, timestamp, method, path, body)
    end
    return table.concat(entries, " ")
  end

  -- Whether any entry of a webhook-signature header is made with any of the secrets. Every
  -- entry is compared with every expected one, whatever matched before: constant time.
  function M.signed_by(secrets, given, id, timestamp, method, path, body)
    local matched = false
    for _, secret in ipairs(assert(M.secret_list(secrets))) do
      local expected = M.signature(secret, id, timestamp, method, path, body)
      for entry in given:gmatch("%S+") do
        if sha256.equal(expected, entry) then
          matched = true
        end
      end
    end
    return matched
  end

  -- A request id nobody has used: "msg_" and 22 URL-safe characters. The 16 bytes behind
  -- them are hashed from `random(16)` (the host's random bytes) when given, else from
  -- math.random (Luanti seeds it with the time at start), with the time and a counter: ids
  -- repeat neither within a process nor when two hosts' sources happen to agree.
  local minted = 0
  local process = tostring({}) -- an address, which two processes rarely share
  function M.new_id(random)
    minted = minted + 1
    local seed = random and random(16)
      or string.format("%.17g %.17g %.17g", math.random(), math.random(), math.random())
    local material = table.concat({seed, process, minted, os.time(), string.format("%.17g", os.clock())}, "\0")
    return "msg_" .. base64.encode_url(sha256.digest(material):sub(1, 16))
  end

  -- The headers of a request the module sends, as "Name: value" lines, and the id they
  -- sign it under (a fresh one unless `id` is given): its answer comes signed under it.
  function M.headers(secrets, module, path, body, now, key, id)
    id = id or M.new_id()
    local timestamp = string.format("%d", math.floor(now))
    return {
      "Content-Type: application/json",
      "X-Roadie-Module: " .. module,
      "X-Roadie-Key: " .. (key or "-"),
      "webhook-id: " .. id,
      "webhook-timestamp: " .. timestamp,
      "webhook-signature: " .. M.signatures(secrets, id, timestamp, "POST", path, body),
    }, id
  end

  -- The answer inside a signed body ({"id", "timestamp", "signature", "answer"}) to the
  -- request sent under `request_id`, decoded; or nil and why. Nothing is carried out from
  -- an answer the engine did not sign, nor from one it signed for another request (an
  -- answer recorded on the wire and played back to a later poll).
  function M.open_signed(secrets, request_id, path, raw, now)
    local envelope, err = json.decode(raw)
    if envelope == nil then
      return nil, "unsigned answer: " .. err
    end
    if type(envelope) ~= "table" or type(envelope.id) ~= "string" or type(envelope.answer) ~= "string"
        or type(envelope.timestamp) ~= "string" or type(envelope.signature) ~= "string" then
      return nil, "unsigned answer: no id, timestamp, signature and answer in its body"
    end
    if not envelope.signature:find("%S") then
      return nil, "unsigned answer: its signature is empty"
    end
    if envelope.id ~= request_id then
      return nil, string.format("answer to another request: its id is '%s', not '%s'",
        envelope.id:sub(1, 70), request_id)
    end
    local timestamp = envelope.timestamp
    if not timestamp:find("^%d+$") or #timestamp > 12 then
      return nil, "unsigned answer: its timestamp is not whole Unix seconds"
    end
    local skew = math.abs(now - tonumber(timestamp))
    if skew > M.MAX_SKEW then
      return nil, string.format("stale answer: %.0fs away from this clock (limit %ds)", skew, M.MAX_SKEW)
    end
    if not M.signed_by(secrets, envelope.signature, request_id, timestamp, M.ANSWER_METHOD, path,
        envelope.answer) then
      return nil, "wrongly signed answer: not made with this module's secret for this request"
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

  -- Whether `fence` is one a call may carry: an integer from 1 to MAX_FENCE.
  function M.valid_fence(fence)
    return type(fence) == "number" and fence == math.floor(fence) and fence >= 1 and fence <= M.MAX_FENCE
  end

  -- What a lease's fence is counted under: `lease#target`, or the lease alone.
  function M.lease_fence_target(lease, target)
    if target == nil or target == json.null then
      return lease
    end
    return lease .. "#" .. target
  end

  -- The answer (with SUPERSEDED) to a call whose fence is older than `mark`, the highest
  -- fence accepted for its target: the call comes from an owner whose claim has lapsed.
  function M.superseded_body(target, fence, mark)
    local message = string.format("fence %s is older than fence %s, already accepted for %s: a newer owner has acted",
      json.encode(fence), json.encode(mark), target)
    return json.object({error = json.object({message = message, retryable = false, field = "fence",
      code = "superseded", fence = mark})})
  end

  return M
end
