"""How the engine judges a remote module's answer: which failures are retried under the
same key, and which are the module's final word."""

from __future__ import annotations

import pytest

from roadie import protocol
from roadie.errors import PermanentError, RetryableError
from roadie.remote.client import _WithHeaders, judge


def test_a_success_is_the_answer() -> None:
    assert judge("world", "dispatch", 200, {"resources": []}) == {"resources": []}


@pytest.mark.parametrize("status", [500, 502, 503, 408, 409, 425, 429])
def test_server_trouble_and_busy_keys_are_retried(status: int) -> None:
    with pytest.raises(RetryableError, match="world dispatch: busy"):
        judge("world", "dispatch", status, protocol.error_body("busy", retryable=True))


def test_retry_after_is_honoured() -> None:
    answer = _WithHeaders.wrap(protocol.error_body("slow down"), {"retry-after": "7"})
    with pytest.raises(RetryableError) as caught:
        judge("world", "dispatch", 429, answer)
    assert caught.value.next_retry_delay == 7.0


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_other_refusals_are_final_with_the_servers_message(status: int) -> None:
    with pytest.raises(PermanentError, match=r"world dispatch: count too high \(params.count\)"):
        judge("world", "dispatch", status, protocol.error_body("count too high", field="params.count"))


def test_a_refusal_without_an_error_body_still_says_what_came() -> None:
    with pytest.raises(PermanentError, match="HTTP 403: nope"):
        judge("world", "revert", 403, "nope")


def test_a_null_for_an_empty_list_or_object_and_a_whole_float_for_an_integer_are_read() -> None:
    """Luanti's JSON writes `{}` and `[]` as `null`, and integers as `1.0`: a revert answer
    `{"failures": null}` is no failure (it was refused as unreadable, and the row stayed
    live though the object was gone)."""
    assert protocol.RevertAnswer.model_validate({"failures": None}).failures == []
    manifest = protocol.Manifest.model_validate(
        {"module": "luanti", "actions": [{"name": "say", "reversible": "none", "params": None}], "leases": None}
    )
    assert (manifest.actions[0].params, manifest.leases) == ({}, [])
    posted = protocol.AnswerPost.model_validate_json('{"id": 12.0, "status": 200.0, "body": null}')
    assert (posted.id, posted.status) == (12, 200)
    with pytest.raises(ValueError, match="resources"):
        protocol.ReportRequest.model_validate({"idempotency_key": "k", "resources": None})  # still at least one
