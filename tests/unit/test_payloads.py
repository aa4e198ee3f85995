"""Payload rules, checked at class definition and at validation."""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from typing import Any, Literal

import pytest

from conventions import ConfigurationError, Id, Payload, PayloadError, sensitive


class Kind(enum.Enum):
    A = "a"


def test_ids_scalars_dates_enums_and_optionals_are_allowed() -> None:
    class Fine(Payload):
        order_id: Id
        count: int
        ref: uuid.UUID
        day: dt.date
        at: dt.datetime
        flag: bool
        kind: Kind
        mode: Literal["fast", "slow"]
        maybe: Id | None = None

    payload = Fine.parse(
        {
            "order_id": "ord_1",
            "count": 2,
            "ref": str(uuid.uuid4()),
            "day": "2026-11-30",
            "at": "2026-11-30T01:00:00+00:00",
            "flag": True,
            "kind": "a",
            "mode": "fast",
        }
    )
    assert payload.day == dt.date(2026, 11, 30)
    assert payload.to_message()["order_id"] == "ord_1"


@pytest.mark.parametrize(
    ("annotation", "hint"),
    [
        (dict[str, Any], "dicts are refused"),
        (list[int], "lists are refused"),
        (float, "floats are refused"),
        (bytes, "bytes are refused"),
        (Any, "free-form Any"),
    ],
)
def test_a_payload_with_a_blob_field_fails_at_definition_with_the_fix(
    annotation: Any, hint: str
) -> None:
    with pytest.raises(ConfigurationError, match=hint):
        type("Bad", (Payload,), {"__annotations__": {"data": annotation}})


def test_a_nested_model_is_refused() -> None:
    class Inner(Payload):
        x: int

    with pytest.raises(ConfigurationError, match="nested models are refused"):
        type("Outer", (Payload,), {"__annotations__": {"inner": Inner}})


def test_a_field_named_email_fails_at_definition_and_says_what_to_do() -> None:
    with pytest.raises(ConfigurationError, match=r"'email' looks like personal data.*send an id"):

        class Bad(Payload):
            email: Id


def test_a_sensitive_looking_field_marked_with_a_reason_is_allowed() -> None:
    class Fine(Payload):
        email_template: Id = sensitive("a template name, not an address", default="basic")

    assert Fine.parse({"email_template": "receipt_v2"}).email_template == "receipt_v2"


def test_an_id_refuses_spaces_and_overlong_values_naming_the_field() -> None:
    class P(Payload):
        order_id: Id

    with pytest.raises(PayloadError) as caught:
        P.parse({"order_id": "x" * 5000})
    assert caught.value.fields == ["order_id"]
    with pytest.raises(PayloadError, match="order_id"):
        P.parse({"order_id": "has space"})


def test_extra_fields_and_missing_fields_are_named() -> None:
    class P(Payload):
        order_id: Id

    with pytest.raises(PayloadError) as caught:
        P.parse({"order_id": "ok", "email": "a@b.c"})
    assert "email" in str(caught.value)
    with pytest.raises(PayloadError, match="order_id"):
        P.parse({})


def test_the_size_cap_refuses_a_large_payload_and_an_override_needs_a_reason() -> None:
    class Many(Payload):
        a: Id
        b: Id
        c: Id
        d: Id
        e: Id
        f: Id
        g: Id
        h: Id
        i: Id

    big = {name: "x" * 120 for name in "abcdefghi"}
    with pytest.raises(PayloadError, match="over the cap of 1024"):
        Many.parse(big).to_message()
    with pytest.raises(ConfigurationError, match="max_bytes_reason"):

        class Large(Payload):
            max_bytes = 4096
            a: Id


def test_payloads_are_frozen() -> None:
    class P(Payload):
        order_id: Id

    payload = P.parse({"order_id": "a"})
    with pytest.raises(Exception, match="frozen"):
        payload.order_id = "b"  # type: ignore[misc]
