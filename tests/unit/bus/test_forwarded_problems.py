"""A problem a bus worker told is told again by the API process as the embedded service would
have told it: the same members, in the same order, with this request's instance."""

from __future__ import annotations

from app.errors import ConflictError, ForwardedError


def test_a_forwarded_problem_reads_as_the_embedded_one() -> None:
    error = ConflictError("stream 'pump-1' runs lstm-seed0 version 1 already", stream="pump-1")
    forwarded = ForwardedError(error.status, error.problem())
    assert forwarded.status == 409
    assert list(forwarded.problem("/v1/streams/pump-1/model").items()) == list(
        error.problem("/v1/streams/pump-1/model").items()
    )
    assert forwarded.problem() == error.problem()
