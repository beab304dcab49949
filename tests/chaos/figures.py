"""Markdown tables from the JSON lines the chaos suite appends to `ROADIE_CHAOS_REPORT`.

.venv/bin/python -m tests.chaos.figures chaos.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from typing import Any


def tables(lines: list[dict[str, Any]]) -> str:
    out: list[str] = []
    kills = [x for x in lines if x["suite"] == "kill"]
    if kills:
        backends = sorted({x["backend"] for x in kills}, key=["sqlite", "postgresql", "mariadb"].index)
        by_point: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
        moments: dict[str, str] = {}
        for x in kills:
            by_point[x["point"]][x["backend"]] = x
            moments[x["point"]] = x["moment"]
        out.append("| point | the process had | " + " | ".join(backends) + " |")
        out.append("| --- | --- | " + " | ".join("---:" for _ in backends) + " |")
        for point, cells in by_point.items():
            row = [
                f"{cells[b]['restored']}/{cells[b]['trials']} restored, {cells[b]['objects_removed_twice']} twice"
                if b in cells
                else "–"
                for b in backends
            ]
            out.append(f"| `{point}` | {moments[point]} | " + " | ".join(row) + " |")
        out.append("")
        total = {b: sum(c[b]["trials"] for c in by_point.values() if b in c) for b in backends}
        made = {b: sum(c[b]["objects_made"] for c in by_point.values() if b in c) for b in backends}
        secs = {b: sum(c[b]["seconds"] for c in by_point.values() if b in c) for b in backends}
        for b in backends:
            out.append(
                f"- {b}: {total[b]} kills and restarts, {made[b]} objects made and each removed once, {secs[b]:.0f} s"
            )
        out.append("")
    soaks = [x for x in lines if x["suite"] == "soak"]
    if soaks:
        kinds = sorted({k for x in soaks for k in x["faults"]})
        out.append(
            "| database | runs | batches | worlds restored | resources lost | removed twice | "
            + " | ".join(f"`{k}`" for k in kinds)
            + " | engine crashes | human retries | seconds |"
        )
        out.append("| --- " + "| ---: " * (8 + len(kinds)) + "|")
        for x in soaks:
            faults = " | ".join(str(x["faults"].get(k, 0)) for k in kinds)
            out.append(
                f"| {x['backend']} | {x['runs']} | {x['batches']} | {x['worlds_restored']}/{x['batches']} | "
                f"{x['resources_lost']} | {x['objects_removed_twice']} | {faults} | "
                f"{sum(x['engine_crashes'].values())} | {x['human_retries']} | {x['seconds']:.0f} |"
            )
        out.append("")
        for x in soaks:
            statuses = ", ".join(f"{k} {v}" for k, v in sorted(x["run_status"].items()))
            crashes = ", ".join(f"{k} {v}" for k, v in sorted(x["engine_crashes"].items()))
            out.append(f"- {x['backend']} (seed {x['seed']}): runs ended {statuses}; engine crashes at {crashes}")
        out.append("")
    reconnects = [x for x in lines if x["suite"] == "reconnect"]
    for x in reconnects:
        out.append(f"- {x['backend']}: {x['killed']} connections killed under a worker carrying {x['runs']} runs")
    for x in (x for x in lines if x["suite"] == "restart"):
        out.append(f"- {x['backend']} restarted under a worker carrying {x['runs']} runs: away {x['down_seconds']} s")
    for x in (x for x in lines if x["suite"] == "network"):
        faults = ", ".join(f"{k} {v}" for k, v in sorted(x["faults"].items()))
        out.append(
            f"- network, 3 worker hosts, {x['runs']} runs, seed {x['seed']}: faults over {x['seconds']} s while runs "
            f"were in flight: {faults}; "
            f"{x['late_answers_refused']} late answers refused; {x['objects']} objects made, "
            f"{x['resources_lost']} lost, {x['removed_twice']} removed twice"
        )
    for x in (x for x in lines if x["suite"] == "failover"):
        out.append(
            f"- failover: {x['failovers']} under {x['runs']} runs (in flight: {x['runs_in_flight']}), primary gone "
            f"{x['down_seconds']} s; {x['objects']} objects made, {x['resources_lost']} lost, "
            f"{x['removed_twice']} removed twice"
        )
    remote = [x for x in lines if x["suite"] == "remote"]
    if remote:
        out += [
            "",
            "| transport | trials | steps | answers lost on purpose | module server kill -9 | steps retried "
            "| attempts | worlds restored |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for transport in ("push", "pull"):
            rows = [x for x in remote if x["transport"] == transport]
            if rows:
                total = {
                    k: sum(x[k] for x in rows) for k in ("steps", "answers_lost", "server_kills", "retried", "attempts")
                }
                restored = sum(1 for x in rows if x["restored"])
                out.append(
                    f"| {transport} | {len(rows)} | {total['steps']} | {total['answers_lost']} "
                    f"| {total['server_kills']} | {total['retried']} | {total['attempts']} | {restored}/{len(rows)} |"
                )
    sims = [x for x in lines if x["suite"] == "sim"]
    if sims:
        invariants = sorted({k for x in sims for k in x["violations"]})
        out += [
            "",
            "| simulation | seeds | runs | scheduler steps | interleavings | crashes injected | seconds | violations |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for x in sims:
            broken = ", ".join(
                f"{k} in {x['violations'][k]} (e.g. seed {x['example_seeds'][k][0]})"
                for k in invariants
                if k in x["violations"]
            )
            out.append(
                f"| {x['backend']} | {x['seeds']} | {x['runs']} | {x['steps']} | {x['interleavings']} "
                f"| {x['crashes']} | {x['seconds']:.0f} | {broken or 'none'} |"
            )
    return "\n".join(out)


def main(argv: list[str]) -> int:
    lines: list[dict[str, Any]] = []
    for path in argv:
        with open(path) as source:
            lines.extend(json.loads(line) for line in source if line.strip())
    print(tables(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
