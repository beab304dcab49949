"""Running the rules (`roadie.conformance.rules`) against one module, in order, each
within its time limit, into a `Report`. The manifest rule and the cleanup rule always
run: the first says what the others may test with, the last takes back what they made."""

from __future__ import annotations

import asyncio

from roadie.conformance.report import Outcome, Report, RuleResult
from roadie.conformance.rules import RULE_NAMES, RULES
from roadie.conformance.session import ConformanceOptions, Failed, Session, Skipped
from roadie.conformance.transport import Transport

__all__ = ["RULES", "RULE_NAMES", "run_checks"]


async def run_checks(transport: Transport, options: ConformanceOptions, *, url: str) -> Report:
    """Check the module behind `transport` against every rule, in order."""
    session = Session(transport, options)
    report = Report(url=url, mode=transport.mode)
    wanted = set(options.rules) if options.rules else None
    for name, title, rule in RULES:
        if wanted is not None and name not in wanted and name not in ("manifest", "cleanup"):
            continue
        if name not in ("manifest", "cleanup") and session.manifest is None:
            report.results.append(RuleResult(name, title, Outcome.SKIP, "no valid manifest"))
            continue
        try:
            detail = await asyncio.wait_for(rule(session), options.rule_timeout)
        except Failed as exc:
            report.results.append(RuleResult(name, title, Outcome.FAIL, str(exc)))
        except Skipped as exc:
            report.results.append(RuleResult(name, title, Outcome.SKIP, str(exc)))
        except TimeoutError:
            report.results.append(RuleResult(name, title, Outcome.FAIL, f"not done within {options.rule_timeout:.0f}s"))
        else:
            report.results.append(RuleResult(name, title, Outcome.PASS, detail))
        if name == "manifest" and session.manifest is not None:
            report.module = session.manifest.module
    return report
