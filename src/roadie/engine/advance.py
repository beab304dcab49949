"""Advance: move each run in flight on — begin its next phase (materialise its steps),
hold it until its duration is over, end it — in one transaction for all of them."""

from __future__ import annotations

from datetime import datetime, timedelta

from roadie.definitions import FrozenDefinition
from roadie.definitions.render import fill_run_id
from roadie.engine import leases
from roadie.engine.base import EngineState, earliest
from roadie.errors import (
    RoadieError,
)
from roadie.log import get_logger
from roadie.states import RunStatus
from roadie.store import NewStep, RunMove
from roadie.store.rows import RunRow

log = get_logger(__name__)


class Advance(EngineState):
    async def _advance(self) -> tuple[bool, datetime | None]:
        """Move every run in flight on as far as it can go now, in one transaction.

        Answers whether anything moved, and the earliest time something will be due.
        Each move is guarded by the run's state as read here, so if two workers advance
        one run, only one move applies; the steps a losing move tried to insert are the
        same rows (the same keys), which the insert ignores.
        """
        due: datetime | None = None
        now = self.clock.now()
        moves: list[RunMove] = []
        in_flight = await self.store.runs_in_flight(known=self._definitions.keys())
        # Forget the runs that ended elsewhere (another worker finished them).
        alive = {c.run.id for c in in_flight}
        for run_id in [i for i in self._definitions if i not in alive]:
            del self._definitions[run_id]
        for counts in in_flight:
            run = counts.run
            frozen = self._frozen(run)
            if run.cancel_requested:
                if counts.ready or not counts.running:
                    status = RunStatus.FAILED if run.error else RunStatus.CANCELLED
                    moves.append(RunMove(run, skip_ready=bool(counts.ready), finish=None if counts.running else status))
                continue
            move = RunMove(run)
            phase, materialised = run.phase, run.materialised_phase
            if materialised < phase:
                assert run.phase_due_at is not None
                if run.phase_due_at > now:
                    due = earliest(due, run.phase_due_at)
                    continue
                try:
                    move.steps = self._steps_of(run, frozen, phase)
                except RoadieError as exc:
                    moves.append(
                        RunMove(run, skip_ready=True, fail=f"phase {frozen.phases[phase].name}: {exc.message}")
                    )
                    continue
                materialised = phase
            elif not (counts.ready or counts.running):
                if phase + 1 < len(frozen.phases):
                    phase += 1
                    after = frozen.phases[phase].after
                    move.phase_due_at = now + timedelta(seconds=after)
                    if after <= 0:  # no delay: begin the next phase in the same move
                        try:
                            move.steps = self._steps_of(run, frozen, phase)
                            materialised = phase
                        except RoadieError:
                            pass  # the next pass, materialising on its own, fails the run
                else:
                    started = run.started_at or now
                    ends_at = run.ends_at or max(now, started + timedelta(seconds=frozen.event.duration))
                    if ends_at <= now:
                        move.finish = RunStatus.SUCCEEDED
                    elif run.ends_at is None:
                        move.ends_at = ends_at
                        due = earliest(due, ends_at)
                    else:
                        due = earliest(due, ends_at)
                        continue
            else:
                continue
            move.phase, move.materialised_phase = phase, materialised
            moves.append(move)
        if not moves:
            return False, due
        await self.store.advance_runs(moves, now)
        for move in moves:
            if move.steps and move.materialised_phase is not None:
                name = self._frozen(move.run).phases[move.materialised_phase].name
                self._tell("phase", {"run_id": move.run.id, "phase": move.materialised_phase, "name": name})
            if move.finish is not None:
                self._definitions.pop(move.run.id, None)
                self._tell("run", {"run_id": move.run.id, "status": move.finish.value})
        return True, due

    def _frozen(self, run: RunRow) -> FrozenDefinition:
        """A run's definition never changes after it is created, so it is parsed once."""
        frozen = self._definitions.get(run.id)
        if frozen is None:
            frozen = self._definitions[run.id] = FrozenDefinition.model_validate(run.definition)
        return frozen

    def _steps_of(self, run: RunRow, frozen: FrozenDefinition, index: int) -> list[NewStep]:
        """The rows materialise inserts for one phase of a run."""
        phase = frozen.phases[index]
        new_steps = []
        for step in phase.steps:
            action = self.registry.action(step.action)
            params = fill_run_id(step.params, run.id)
            params = leases.borrow_params(self.registry, params) if action.borrows else params
            lease_ref = leases.lease_ref(self.registry, params) if action.borrows else None
            new_steps.append(
                NewStep(
                    phase=step.phase,
                    seq=step.seq,
                    name=step.name,
                    action=step.action,
                    owner=action.owner,
                    reversible=action.reversible,
                    lease_ref=lease_ref,
                    params=params,
                    # Minted once, here, and never changed by a retry (DESIGN §1).
                    idempotency_key=f"{run.nonce}-{run.id}-{step.phase}-{step.seq}",
                    max_attempts=step.retry.attempts,
                    retry=step.retry.model_dump(mode="json"),
                    timeout=step.timeout,
                    on_error=step.on_error.value,
                )
            )
        return new_steps
