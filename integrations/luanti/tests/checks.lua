-- What the SDK's test files share: a check that counts, prints each failure, and an end that
-- prints "ok: ..." or "FAILED: n of ..." and exits 1 on any failure (tests/luanti reads both);
-- and the value of a header among "Name: value" lines, found in any case.
return function()
  local t = {checks = 0, failures = 0}
  function t.header(lines, name)
    for _, line in ipairs(lines) do
      local n, v = line:match("^([^:]+): (.*)$")
      if n and n:lower() == name:lower() then
        return v
      end
    end
  end
  function t.check(ok, what)
    t.checks = t.checks + 1
    if not ok then
      t.failures = t.failures + 1
      print("FAIL: " .. what)
    end
  end
  function t.finish(summary)
    summary = string.format("%d checks%s", t.checks, summary and (" " .. summary) or "")
    if t.failures > 0 then
      print(string.format("FAILED: %d of %s", t.failures, summary))
      os.exit(1)
    end
    print("ok: " .. summary)
    os.exit(0)
  end
  return t
end
