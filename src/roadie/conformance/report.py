"""What a conformance run found: one result per rule, pass, fail or skip."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Outcome(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"  # the rule does not apply (no lease to test, no target given)


@dataclass(frozen=True)
class RuleResult:
    rule: str
    title: str
    outcome: Outcome
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "title": self.title, "outcome": self.outcome.value, "detail": self.detail}


@dataclass
class Report:
    """The results, in the order the rules ran. `ok` when none failed."""

    url: str
    mode: str
    module: str | None = None
    results: list[RuleResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def failed(self) -> list[RuleResult]:
        return [r for r in self.results if r.outcome is Outcome.FAIL]

    def result(self, rule: str) -> RuleResult:
        for result in self.results:
            if result.rule == rule:
                return result
        raise KeyError(rule)

    def as_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "mode": self.mode,
            "module": self.module,
            "ok": self.ok,
            "results": [r.as_dict() for r in self.results],
        }
