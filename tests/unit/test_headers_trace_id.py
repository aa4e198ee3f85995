"""The trace id a dead letter shows (``tracing.headers.trace_id``): from a well-formed W3C
``traceparent`` only; a foreign producer's malformed one shows nothing, never its text."""

from __future__ import annotations

import pytest

from conventions.tracing.headers import trace_id

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}, TRACE),
        ({"traceparent": f" 00-{TRACE.upper()}-00F067AA0BA902B7-01 "}, TRACE),
        ({"traceparent": f"00-{'0' * 32}-00f067aa0ba902b7-01"}, None),  # invalid by W3C
        ({"traceparent": "<script>alert(1)</script>"}, None),
        ({"traceparent": 12}, None),
        ({}, None),
        (None, None),
    ],
)
def test_the_trace_id_comes_from_a_well_formed_traceparent_only(
    headers: dict[str, object] | None, expected: str | None
) -> None:
    assert trace_id(headers) == expected
