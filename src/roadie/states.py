"""The states of runs, steps and ledger rows. Never bare strings elsewhere."""

from __future__ import annotations

from enum import StrEnum


class Reversible(StrEnum):
    """How the effect of an action is taken back down (DESIGN §3)."""

    NONE = "none"
    SELF = "self"
    LEDGER = "ledger"
    OVERRIDE = "override"


class RunStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_RUN_STATUSES


TERMINAL_RUN_STATUSES = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})


class CleanupPolicy(StrEnum):
    AUTO = "auto"
    MANUAL = "manual"


class CleanupStatus(StrEnum):
    NOT_REQUIRED = "not_required"
    PENDING = "pending"
    COMPLETE = "complete"  # nothing live, and the world inspected (or not inspectable): see Verdict
    INCOMPLETE = "incomplete"  # something could not be reverted: a human retries
    ROLLED_BACK = "rolled_back"  # the world was found partially rolled back: due again by itself
    HELD = "held"  # more to revert than a module's cap: waits for a person to confirm


# The cleanup statuses a cleanup is due from: claimed without a human's "again".
CLEANUP_DUE = frozenset({CleanupStatus.PENDING.value, CleanupStatus.ROLLED_BACK.value})

# A run found partially rolled back is cleaned up (and read back) again by the workers,
# whatever its policy (a cleanup was asked for already), up to this many cleanup rounds in
# all; then it waits for a human, as `incomplete` does.
AUTO_CLEANUP_ROUNDS = 5


def awaits_auto_cleanup(policy: str, cleanup_status: str, attempts: int) -> bool:
    """Whether a worker will clean up an ended run by itself, now or soon."""
    if cleanup_status == CleanupStatus.ROLLED_BACK.value:
        return attempts < AUTO_CLEANUP_ROUNDS
    return policy == CleanupPolicy.AUTO.value and cleanup_status == CleanupStatus.PENDING.value


class Verdict(StrEnum):
    """What inspecting the world after a cleanup proved (DESIGN §6, Verify)."""

    VERIFIED_CLEAN = "verified_clean"  # every reverted resource and restored lease inspected: gone, given back
    PARTIALLY_ROLLED_BACK = "partially_rolled_back"  # something came back, is still there, or was not inspected
    UNVERIFIED = "unverified"  # clean as far as inspected; some rows cannot be inspected, or were left alone


def judge_cleanup(read_back: Verdict, status: CleanupStatus, left_alone: int) -> Verdict:
    """A cleanup's verdict, from what reading the world back found (`read_back`) and how
    the cleanup ended: never one that its status contradicts. *Verified clean* needs the
    cleanup `complete` with nothing left alone: a row still live (a revert that failed, a
    lease another restorer holds) is something still in the world, and a value left alone
    (set by hand since) is a world that is not what it was before the run."""
    if status in (CleanupStatus.INCOMPLETE, CleanupStatus.PENDING, CleanupStatus.ROLLED_BACK):
        return Verdict.PARTIALLY_ROLLED_BACK
    if read_back is Verdict.VERIFIED_CLEAN and left_alone:
        return Verdict.UNVERIFIED
    return read_back


class StepStatus(StrEnum):
    READY = "ready"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"

    @property
    def ended(self) -> bool:
        return self in (StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.SKIPPED)


class OnError(StrEnum):
    FAIL = "fail"
    CONTINUE = "continue"


class ResourceState(StrEnum):
    """A ledger row's life. `pending` and `live` rows hold their target."""

    PENDING = "pending"  # a placeholder awaiting its answer, or a lease reserved before dispatch
    LIVE = "live"  # confirmed: the world holds it and cleanup will come back for it
    RESOLVED = "resolved"  # a placeholder whose step answered; the real rows carry on
    REVERTED = "reverted"  # taken back down; kept for history, target freed
    ABANDONED = "abandoned"  # forgotten by an admin; kept for history, target freed

    @property
    def holds_target(self) -> bool:
        return self in (ResourceState.PENDING, ResourceState.LIVE)


STEP_KIND = "@step"
OVERRIDE_KIND = "override"
# A run's layer of a lease that stacks: its ref is the borrowing step's key, so each run
# holds its own layer of one target; its payload names the lease.
LAYER_KIND = "@layer"
LEASE_KINDS = (OVERRIDE_KIND, LAYER_KIND)
# Core's own wait has nothing in the world to finish: cancelling its run cuts it short.
WAIT_ACTION = "core.wait"


class WorkerState(StrEnum):
    """A worker as `roadie workers` shows it, judged by its heartbeat's age."""

    ALIVE = "alive"
    STOPPED = "stopped"  # it deregistered: shut down cleanly
    DEAD = "dead"  # no heartbeat for a claim's lifetime: killed, or its machine is gone
