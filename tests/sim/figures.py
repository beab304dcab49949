"""What a batch of seeds did: seeds, steps, interleavings, crashes, violations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.sim.simulation import INVARIANTS, SeedResult


@dataclass
class Figures:
    backend: str
    seeds: int = 0
    steps: int = 0
    interleavings: int = 0
    crashes: int = 0
    runs: int = 0
    seconds: float = 0.0
    violated: dict[str, list[int]] = field(default_factory=dict)  # invariant -> seeds that broke it

    def add(self, result: SeedResult) -> None:
        self.seeds += 1
        self.steps += result.steps
        self.interleavings += result.interleavings
        self.crashes += result.crashes
        self.runs += result.runs
        for invariant in sorted({v.invariant for v in result.violations}):
            self.violated.setdefault(invariant, []).append(result.seed)

    def progress(self, of: int, seconds: float) -> str:
        """A line saying how far a batch has gone, for a run of hours."""
        violating = len({seed for seeds in self.violated.values() for seed in seeds})
        return f"{self.backend}: {self.seeds} of {of} seeds, {violating} with a violation, {seconds:.0f}s"

    def table(self) -> str:
        lines = [
            f"simulation on {self.backend}: {self.seeds} seeds, {self.runs} runs, {self.steps} scheduler steps, "
            f"{self.interleavings} interleavings, {self.crashes} crashes injected, {self.seconds:.0f}s",
            "| invariant | seeds that broke it | first seeds |",
            "| --- | ---: | --- |",
        ]
        for invariant, what in INVARIANTS.items():
            seeds = self.violated.get(invariant, [])
            lines.append(f"| {invariant}: {what} | {len(seeds)} | {', '.join(map(str, seeds[:5]))} |")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "suite": "sim",
            "backend": self.backend,
            "seeds": self.seeds,
            "runs": self.runs,
            "steps": self.steps,
            "interleavings": self.interleavings,
            "crashes": self.crashes,
            "seconds": round(self.seconds, 1),
            "violations": {k: len(v) for k, v in self.violated.items()},
            "example_seeds": {k: v[:5] for k, v in self.violated.items()},
        }
