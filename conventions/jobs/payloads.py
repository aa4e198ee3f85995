"""Versioned, id-only payloads.

A payload names *what* to work on, never carries the data itself: ids, business dates,
small scalars, enums and flags. Data read at run time is fresh; data copied into a
message is stale by the time a retry runs, leaks PII into the broker and Flower, and
makes messages large. The rules are checked when the payload class is defined, so a
bad payload fails at import with a message that says the fix.

    class SendReceipt(Payload):
        order_id: Id
"""

from __future__ import annotations

import datetime as dt
import enum
import re
import types
import typing
import uuid
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from conventions.errors import ConfigurationError, PayloadError

#: an identifier: letters, digits and ``_ . : -``, 1 to 128 characters
Id = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:\-]+$", min_length=1, max_length=128)]

#: serialized-size cap of a payload (bytes of compact JSON) unless the class overrides it
DEFAULT_MAX_BYTES = 1024

#: field-name fragments that look like personal data or secrets
SENSITIVE_NAME = re.compile(
    r"(e_?mail|phone|mobile|password|passwd|secret|token|api_?key|address|"
    r"card|iban|ssn|birth|credential|session)",
    re.IGNORECASE,
)

_SCALARS: tuple[type, ...] = (str, int, bool, uuid.UUID, dt.date, dt.datetime)
_REFUSED: dict[type, str] = {
    float: "floats are refused: send money as integer minor units or an id",
    bytes: "bytes are refused: store the blob and send its id",
    dict: "dicts are refused: send the id of the thing, read its data in the job",
    list: "lists are refused: publish one job per item (fan-out) or send a batch id",
    tuple: "tuples are refused: publish one job per item or send a batch id",
    set: "sets are refused: publish one job per item or send a batch id",
    frozenset: "sets are refused: publish one job per item or send a batch id",
}


def sensitive(reason: str, **kwargs: Any) -> Any:
    """Mark a field whose name looks sensitive as allowed, with the reason why.

    ``customer_email_id: Id = sensitive("an id of the address, not the address")``
    """
    if not reason.strip():
        raise ConfigurationError("sensitive() needs a reason saying why the field is safe")
    extra = dict(kwargs.pop("json_schema_extra", None) or {})
    extra["sensitive_reason"] = reason
    return Field(json_schema_extra=extra, **kwargs)


def _refusal(annotation: Any) -> str | None:
    """Why ``annotation`` is not an id-only type, or None when it is fine."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _refusal(typing.get_args(annotation)[0])
    if origin is Literal:
        return None
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if arg is type(None):
                continue
            reason = _refusal(arg)
            if reason:
                return reason
        return None
    if origin is not None:
        base = origin if isinstance(origin, type) else None
        for refused, reason in _REFUSED.items():
            if base is not None and issubclass(base, refused):
                return reason
        return f"{annotation!r} is not an id-only type"
    if annotation is Any or annotation is object:
        return "free-form Any is refused: declare the id or scalar it really is"
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return "nested models are refused: send the nested object's id"
        if issubclass(annotation, enum.Enum):
            return None
        if annotation is bool or annotation in _SCALARS:
            return None
        for refused, reason in _REFUSED.items():
            if issubclass(annotation, refused):
                return reason
    return f"{annotation!r} is not an id-only type (ids, ints, UUIDs, dates, bools, enums)"


class Payload(BaseModel):
    """Base class of every task payload: frozen, no extra fields, id-only, size-capped."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=False)

    #: serialized-size cap in bytes; override per payload together with ``max_bytes_reason``
    max_bytes: ClassVar[int] = DEFAULT_MAX_BYTES
    #: why this payload needs a cap other than the default
    max_bytes_reason: ClassVar[str | None] = None

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if cls.max_bytes != DEFAULT_MAX_BYTES and not cls.max_bytes_reason:
            raise ConfigurationError(
                f"{cls.__name__}: max_bytes = {cls.max_bytes} needs max_bytes_reason = '...' "
                "saying why this payload may be larger than the default"
            )
        problems: list[str] = []
        for name, info in cls.model_fields.items():
            reason = _refusal(info.annotation)
            if reason:
                problems.append(f"field {name!r}: {reason}")
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            if SENSITIVE_NAME.search(name) and not extra.get("sensitive_reason"):
                problems.append(
                    f"field {name!r} looks like personal data or a secret: send an id instead "
                    "(e.g. customer_id) or mark it with sensitive('why it is safe')"
                )
        if problems:
            raise ConfigurationError(
                f"payload {cls.__name__} is not id-only:\n  " + "\n  ".join(problems)
            )

    @classmethod
    def parse(cls, data: dict[str, Any], task: str | None = None) -> typing.Self:
        """Validate ``data`` into a payload, raising PayloadError that names every bad field."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise PayloadError.from_validation_error(exc, task=task or cls.__name__) from None

    def to_message(self) -> dict[str, Any]:
        """The JSON-ready kwargs this payload travels as, checked against the size cap."""
        data = self.model_dump(mode="json")
        size = len(self.__pydantic_serializer__.to_json(self))
        if size > self.max_bytes:
            msg = f"payload is {size} bytes, over the cap of {self.max_bytes}"
            raise PayloadError(
                errors=[{"loc": [], "msg": msg, "type": "payload_too_large"}],
                task=type(self).__name__,
            )
        return data
