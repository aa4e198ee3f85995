"""The error tree: drawn once in the docstring, checked against the live hierarchy."""

from __future__ import annotations

import pickle
import textwrap
from typing import Any

import pytest

from conventions import errors
from conventions.errors import (
    BackendUnavailable,
    ConfigurationError,
    ConventionsError,
    JobOutcome,
    KeyConflict,
    KeyHeld,
    LayerError,
    LockBusy,
    MissingExtra,
    NewerFormat,
    PayloadError,
    PermanentError,
    QueueOverCapacity,
    ResumeLater,
    SkipJob,
    TransientError,
    UncertainOutcomeError,
    Unroutable,
    tree,
)

ALL = [
    ConventionsError,
    JobOutcome,
    TransientError,
    LockBusy,
    PermanentError,
    UncertainOutcomeError,
    SkipJob,
    ResumeLater,
    LayerError,
    ConfigurationError,
    MissingExtra,
    PayloadError,
    KeyConflict,
    QueueOverCapacity,
    KeyHeld,
    BackendUnavailable,
    Unroutable,
    NewerFormat,
]


def drawing() -> str:
    """The tree drawn in the module docstring: from the ``ConventionsError`` line to the
    first blank line, dedented."""
    lines = (errors.__doc__ or "").splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "ConventionsError")
    end = next(i for i in range(start, len(lines)) if not lines[i].strip())
    return textwrap.dedent("\n".join(lines[start:end]))


def test_the_docstring_drawing_is_the_live_class_tree() -> None:
    assert drawing() == tree()


def test_the_tree_lists_every_class_once_in_definition_order() -> None:
    names = [line.lstrip("|+-` ") for line in tree().splitlines()]
    assert names == [cls.__name__ for cls in ALL]


def test_an_application_subclass_does_not_change_the_layer_tree() -> None:
    class RateLimited(TransientError):
        """Rate limited."""

    assert drawing() == tree()


@pytest.mark.parametrize("cls", ALL, ids=lambda cls: cls.__name__)
def test_every_class_defaults_its_message_to_its_docstring_first_line(
    cls: type[ConventionsError],
) -> None:
    first_line = (cls.__doc__ or "").strip().splitlines()[0]
    assert str(cls()) == first_line
    assert cls().message == first_line


def test_a_given_message_replaces_the_default() -> None:
    assert str(PermanentError("card declined")) == "card declined"


def test_a_subclass_without_a_docstring_inherits_the_default_message() -> None:
    class Declined(PermanentError):
        pass

    assert str(Declined()) == str(PermanentError())


def test_outcomes_and_faults_are_separate_branches() -> None:
    for outcome in (TransientError, PermanentError, UncertainOutcomeError, SkipJob):
        assert issubclass(outcome, JobOutcome)
        assert not issubclass(outcome, LayerError)
    for fault in (ConfigurationError, PayloadError, QueueOverCapacity):
        assert issubclass(fault, LayerError)
        assert not issubclass(fault, JobOutcome)


def test_a_transient_error_carries_its_retry_after() -> None:
    assert TransientError("slow down", retry_after=30).retry_after == 30.0
    assert TransientError().retry_after is None


def test_a_negative_retry_after_counts_as_zero_and_nan_as_not_given() -> None:
    assert TransientError(retry_after=-5).retry_after == 0.0
    assert TransientError(retry_after=float("nan")).retry_after is None


ERRORS: list[dict[str, Any]] = [
    {"loc": ("amount",), "msg": "Input should be greater than 0", "type": "greater_than"},
    {"loc": ("customer", "id"), "msg": "Field required", "type": "missing"},
    {"loc": ["items", 0, "sku"], "msg": "String should match pattern", "type": "string_pattern"},
]


def test_a_payload_error_names_every_bad_field() -> None:
    text = str(PayloadError(errors=ERRORS, task="orders.charge.v1"))
    for field in ("amount", "customer.id", "items.0.sku"):
        assert field in text
    assert "orders.charge.v1" in text
    assert "Field required" in text


def test_a_payload_error_keeps_its_errors_task_and_field_list() -> None:
    exc = PayloadError(errors=ERRORS, task="orders.charge.v1")
    assert exc.task == "orders.charge.v1"
    assert exc.errors[1]["msg"] == "Field required"
    assert exc.fields == ["amount", "customer.id", "items.0.sku"]


def test_a_payload_error_is_also_a_value_error() -> None:
    assert isinstance(PayloadError(), ValueError)


def test_a_payload_error_with_an_explicit_message_keeps_it_verbatim() -> None:
    exc = PayloadError("bad call", errors=ERRORS)
    assert str(exc) == "bad call"
    assert exc.fields == ["amount", "customer.id", "items.0.sku"]


def test_a_payload_error_from_pydantic_drops_the_input_values() -> None:
    from pydantic import BaseModel, ValidationError

    class Charge(BaseModel):
        amount: int
        email_hash: str

    with pytest.raises(ValidationError) as caught:
        Charge.model_validate({"amount": "secret-123"})
    exc = PayloadError.from_validation_error(caught.value, task="orders.charge.v1")
    assert exc.fields == ["amount", "email_hash"]
    assert "secret-123" not in str(exc)
    assert all("input" not in error for error in exc.errors)


def test_a_queue_over_capacity_error_names_its_queue() -> None:
    exc = QueueOverCapacity(queue="email")
    assert exc.queue == "email"
    assert "'email'" in str(exc)


@pytest.mark.parametrize(
    "exc",
    [
        TransientError("busy", retry_after=12.5),
        PayloadError(errors=ERRORS, task="orders.charge.v1"),
        QueueOverCapacity(queue="email"),
        KeyHeld(key="app:orders.charge.v1:charge:7", holder="job-1"),
        SkipJob("nothing to do"),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_errors_survive_pickling_with_their_attributes(exc: ConventionsError) -> None:
    copy = pickle.loads(pickle.dumps(exc))
    assert type(copy) is type(exc)
    assert str(copy) == str(exc)
    assert vars(copy) == vars(exc)


def test_errors_survive_being_rebuilt_from_their_args_as_celery_does() -> None:
    exc = PayloadError(errors=ERRORS, task="orders.charge.v1")
    assert str(PayloadError(*exc.args)) == str(exc)
