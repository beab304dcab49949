"""A live Rich display of a run: one bar per phase, a line per retry and failure."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.text import Text

from roadie.definitions import FrozenDefinition


class RunProgress:
    """An engine observer that draws the phases of the runs it is told about."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("{task.fields[label]}", style="bold", markup=False),
            BarColumn(bar_width=20),
            MofNCompleteColumn(),
            TextColumn("{task.fields[note]}", markup=False),
            console=console,
            transient=False,
        )
        self._phases: dict[tuple[int, int], TaskID] = {}
        self._names: dict[int, list[str]] = {}
        self._cleanup: dict[int, TaskID] = {}

    def watch(self, run_id: int, definition: dict[str, Any]) -> None:
        frozen = FrozenDefinition.model_validate(definition)
        self._names[run_id] = [p.name for p in frozen.phases]
        for index, phase in enumerate(frozen.phases):
            label = f"{index + 1}. {phase.name}"
            note = f"after {phase.after:g}s" if phase.after else ""
            self._phases[(run_id, index)] = self.progress.add_task(
                label, total=len(phase.steps), label=label, note=note, start=False
            )

    def __enter__(self) -> RunProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        run_id = int(data.get("run_id", 0))
        if kind == "phase":
            task = self._phases.get((run_id, int(data["phase"])))
            if task is not None:
                self.progress.start_task(task)
                self.progress.update(task, note="")
        elif kind == "step":
            self._step(run_id, data)
        elif kind == "run":
            self.progress.console.print(Text.assemble(f"  run {run_id} ended ", (str(data["status"]), "bold")))
        elif kind == "cleanup":
            self._cleanup_event(run_id, data)

    def _step(self, run_id: int, data: dict[str, Any]) -> None:
        status = data["status"]
        task = self._phases.get((run_id, int(data.get("phase", -1))))
        if status == "retry":
            self.console.print(
                Text.assemble(
                    "  ", ("↻", "yellow"), f" {data['step']}: {data.get('error')} — retrying under the same key"
                )
            )
        elif status in ("succeeded", "failed", "skipped"):
            if task is not None:
                self.progress.advance(task)
            if status == "failed":
                self.console.print(Text.assemble("  ", ("✗", "red"), f" {data['step']}: {data.get('error')}"))
            for reason in data.get("rejections") or []:
                self.console.print(Text.assemble("  ", ("!", "magenta"), f" {data['step']}: {reason}"))

    def _cleanup_event(self, run_id: int, data: dict[str, Any]) -> None:
        if data["status"] == "started":
            label = "cleanup"
            self._cleanup[run_id] = self.progress.add_task(label, total=1, label=label, note="reverting")
            return
        task = self._cleanup.get(run_id)
        report = data.get("report", {})
        verdict = str(report.get("verdict") or "").replace("_", " ")
        note = (
            f"{report.get('reverted', 0)} reverted, {report.get('restored', 0)} restored, "
            f"{report.get('failed', 0)} failed — {data['status']}" + (f", {verdict}" if verdict else "")
        )
        if task is not None:
            self.progress.update(task, completed=1, note=note)
