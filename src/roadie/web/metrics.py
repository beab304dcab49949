"""Prometheus metrics of one `roadie serve` process.

Counters and histograms are fed by the engine's observer hook, so they count what this
process's worker did; the gauges (runs by state, live ledger rows) are read from the
database at scrape time, so they are true for every worker on it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from roadie.states import RunStatus
from roadie.store import Store

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class StoreGauges(Collector):
    """Gauges computed from the store. `refresh` is awaited before each scrape, since
    `collect` (called by prometheus-client) cannot await."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}
        self.live_rows = 0

    async def refresh(self, store: Store) -> None:
        self.runs = await store.count_runs_by_status()
        self.live_rows = await store.count_all_live_resources()

    def collect(self) -> Iterator[Metric]:
        runs = GaugeMetricFamily("roadie_runs", "Runs by state.", labels=["state"])
        for state in RunStatus:
            runs.add_metric([state.value], self.runs.get(state.value, 0))
        yield runs
        yield GaugeMetricFamily("roadie_ledger_rows_live", "Ledger rows that still hold their target.", self.live_rows)


class Metrics:
    """The registry of one app, and the engine observer that feeds it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.dispatched = Counter(
            "roadie_steps_dispatched", "Step attempts dispatched by this process.", registry=self.registry
        )
        self.failed = Counter("roadie_steps_failed", "Steps that failed for good.", registry=self.registry)
        self.retried = Counter("roadie_steps_retried", "Step attempts that will be retried.", registry=self.registry)
        self.succeeded = Counter("roadie_steps_succeeded", "Steps that succeeded.", registry=self.registry)
        self.dispatch_latency = Histogram(
            "roadie_dispatch_latency_seconds",
            "From a step's dispatch to its answer being recorded.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=self.registry,
        )
        self.cleanup_duration = Histogram(
            "roadie_cleanup_duration_seconds",
            "How long a cleanup took, by how it ended.",
            labelnames=["status"],
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300),
            registry=self.registry,
        )
        self.gauges = StoreGauges()
        self.registry.register(self.gauges)
        self._dispatched_at: dict[tuple[int, str], float] = {}
        self._cleanup_at: dict[int, float] = {}

    def observe(self, kind: str, data: dict[str, Any]) -> None:
        """The engine's observer: one call per phase, step, run and cleanup event."""
        now = time.monotonic()
        run_id = int(data.get("run_id", 0))
        if kind == "step":
            key = (run_id, str(data.get("step")))
            status = data.get("status")
            if status == "running":
                self.dispatched.inc()
                self._dispatched_at[key] = now
                return
            started = self._dispatched_at.pop(key, None)
            if started is not None:
                self.dispatch_latency.observe(now - started)
            if status == "succeeded":
                self.succeeded.inc()
            elif status == "retry":
                self.retried.inc()
            elif status == "failed":
                self.failed.inc()
        elif kind == "cleanup":
            if data.get("status") == "started":
                self._cleanup_at[run_id] = now
            else:
                began = self._cleanup_at.pop(run_id, None)
                if began is not None:
                    self.cleanup_duration.labels(str(data.get("status"))).observe(now - began)

    async def render(self, store: Store) -> bytes:
        await self.gauges.refresh(store)
        return generate_latest(self.registry)
