"""The conformance kit: check any module server, in any language, against the remote
protocol (docs/protocol.md, DESIGN §6).

```python
report = await run_conformance("http://10.0.0.5:7300", secret, options=ConformanceOptions())
for result in report.results:
    print(result.rule, result.outcome, result.detail)
```

`roadie conformance URL --secret S` runs it from the command line. Everything the checks
make is made under keys of their own and reverted by key at the end, so the kit may be
pointed at a live world.
"""

from __future__ import annotations

from roadie.conformance.checks import RULE_NAMES, RULES, run_checks
from roadie.conformance.params import example_params
from roadie.conformance.report import Outcome, Report, RuleResult
from roadie.conformance.session import ConformanceOptions
from roadie.conformance.transport import Kind, PushClient, RawTransport, Transport


async def run_conformance(url: str, secret: str, *, options: ConformanceOptions | None = None) -> Report:
    """Check the module server at `url` (push), or, with `options.pull`, serve a work queue
    at `url` and check the module that polls it. Never raises for what the module does:
    every finding is in the report."""
    options = options or ConformanceOptions()
    if options.pull:
        from roadie.conformance.pull import serve_queue

        async with serve_queue(url, secret, options) as transport:
            return await run_checks(transport, options, url=url)
    client = PushClient(url, secret, timeout=options.timeout, transport=options.http_transport)
    try:
        return await run_checks(client, options, url=url)
    finally:
        await client.aclose()


__all__ = [
    "RULES",
    "RULE_NAMES",
    "ConformanceOptions",
    "Kind",
    "Outcome",
    "PushClient",
    "RawTransport",
    "Report",
    "RuleResult",
    "Transport",
    "example_params",
    "run_checks",
    "run_conformance",
]
