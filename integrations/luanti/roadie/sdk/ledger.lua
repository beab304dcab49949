-- The key ledger (docs/protocol.md §4): idempotency key -> answer, the borrows of every
-- lease target, the fence marks, and a little state of the module's own, kept in a journal
-- that each change is appended to (and flushed) before the answer that depends on it is sent.
--
-- `store` is where the journal lives: {load() -> text or nil, append(line),
-- replace(text)}; `replace` must be atomic (a temporary file renamed over the old one).
-- A server killed mid-append leaves a torn last line, which is ignored.
return function(sdk)
  local json = sdk.json
  local M = {}
  local Ledger = {}
  Ledger.__index = Ledger

  local function fresh()
    return {seq = 0, answers = {}, borrows = {}, restores = {}, applied_at = {}, data = {}, marks = {}}
  end

  -- One journal entry, folded into the state: the same code replays the journal at open.
  local function fold(state, entry)
    state.seq = state.seq + 1
    local e = entry.e
    if e == "state" then
      local seq = state.seq
      for name, value in pairs(entry.v) do
        state[name] = value
      end
      state.seq = math.max(state.seq, seq)
    elseif e == "answer" then
      state.answers[entry.k] = {status = entry.s, body = entry.b}
    elseif e == "read" or e == "apply" then
      local borrows = state.borrows[entry.t] or json.object({})
      state.borrows[entry.t] = borrows
      local borrow = borrows[entry.k] or json.object({run = entry.r, applied = false})
      borrows[entry.k] = borrow
      if e == "apply" then
        borrow.applied = true
        state.applied_at[entry.t] = state.seq
      end
    elseif e == "back" then
      for _, borrow in pairs(state.borrows[entry.t] or {}) do
        if borrow.run == entry.r and borrow.back == nil then
          borrow.back = entry.by
        end
      end
    elseif e == "mark" then
      if (state.marks[entry.t] or 0) < entry.f then
        state.marks[entry.t] = entry.f
      end
    elseif e == "restore" then
      state.restores[entry.k] = json.object({t = entry.t, seq = state.seq})
    elseif e == "data" then
      if entry.v == json.null then
        state.data[entry.n] = nil
      else
        state.data[entry.n] = entry.v
      end
    end
  end

  -- Open the ledger kept in `store`, replaying its journal, then compacting it to one entry.
  function M.open(store)
    local self = setmetatable({store = store, state = fresh(), skipped = 0}, Ledger)
    local text = store.load() or ""
    local lines = {}
    for line in text:gmatch("[^\n]+") do
      lines[#lines + 1] = line
    end
    for i, line in ipairs(lines) do
      local entry = json.decode(line)
      if type(entry) == "table" and type(entry.e) == "string" then
        fold(self.state, entry)
      elseif i < #lines then
        self.skipped = self.skipped + 1 -- not a torn tail: a damaged line, counted for the log
      end
    end
    for name, value in pairs(fresh()) do
      if self.state[name] == nil then
        self.state[name] = value
      end
    end
    local snapshot = {}
    for name, value in pairs(self.state) do
      snapshot[name] = type(value) == "table" and json.object(value) or value
    end
    store.replace(json.encode({e = "state", v = json.object(snapshot)}) .. "\n")
    return self
  end

  function Ledger:_write(entry)
    fold(self.state, entry)
    self.store.append(json.encode(json.object(entry)) .. "\n")
  end

  -- A dispatch's stored answer: {status, body}, or nil.
  function Ledger:answer(key)
    return self.state.answers[key]
  end

  function Ledger:remember(key, status, body)
    self:_write({e = "answer", k = key, s = status, b = body})
  end

  -- Fences: for each fence target (a step's key; a lease's `lease#target`, or the lease
  -- alone), the highest fence accepted, its mark. A call with a lower fence comes from an
  -- owner whose claim has lapsed since a newer owner acted: it must do nothing, not even
  -- answer from the ledger. Equal is accepted (one claim makes several calls: retries, a
  -- read then an apply).
  function Ledger:mark(target)
    return self.state.marks[target]
  end

  -- May a call under `fence` act on `target`? true, with the mark raised to `fence` in the
  -- journal before the call acts (so a restart keeps it); or false and the mark.
  function Ledger:fence(target, fence)
    local mark = self.state.marks[target]
    if mark ~= nil and fence < mark then
      return false, mark
    end
    if mark == nil or fence > mark then
      self:_write({e = "mark", t = target, f = fence})
    end
    return true
  end

  -- The module's own small state, kept like the answers.
  function Ledger:get(name)
    return self.state.data[name]
  end

  function Ledger:set(name, value)
    self:_write({e = "data", n = name, v = value == nil and json.null or value})
  end

  -- Leases (§4, rule 6). `target` names the lease and its target: "time_of_day#".
  function Ledger:read(key, run, target)
    local borrows = self.state.borrows[target]
    if not (borrows and borrows[key]) then
      self:_write({e = "read", k = key, r = run, t = target})
    end
  end

  -- May this apply write the world? true; true, "done" when it was applied already
  -- (answer again, write nothing); or false and why it is refused.
  function Ledger:may_apply(key, run, target)
    local borrows = self.state.borrows[target] or {}
    local mine = borrows[key]
    if mine ~= nil then
      if mine.back ~= nil then
        return false, string.format("key '%s': its borrow was given back (%s); a late apply is not carried out",
          key, mine.back)
      end
      return true, mine.applied and "done" or nil
    end
    local held, live = false, false
    for _, borrow in pairs(borrows) do
      if borrow.run == run then
        held = true
        live = live or borrow.back == nil
      end
    end
    if held and not live then
      return false, string.format("key '%s': run %s gave back every borrow of %s; a late apply is not carried out",
        key, tostring(run), target)
    end
    return true
  end

  function Ledger:applied(key, run, target)
    self:_write({e = "apply", k = key, r = run, t = target})
  end

  -- Before a restore writes: mark the run's borrows of the target given back (durably),
  -- and say whether to write. A restore carried out already writes again only if no
  -- borrow of the target was applied since (it would write over another run's borrow).
  function Ledger:may_restore(key, run, target)
    local done = self.state.restores[key]
    if done ~= nil and (self.state.applied_at[target] or 0) > done.seq then
      return false
    end
    self:_write({e = "back", r = run, t = target, by = key})
    return true
  end

  function Ledger:restored(key, target)
    self:_write({e = "restore", k = key, t = target})
  end

  return M
end
