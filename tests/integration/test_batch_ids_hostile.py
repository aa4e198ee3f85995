"""Batch ids from hostile or careless callers: one rule (:mod:`conventions.batches.ids`),
checked at ``app.batch()`` and ``Batch.batch()``, so that no batch is made whose callback
or members' ``cc_batch`` header a worker cannot carry (such a batch never ended). The
ids the rule takes do end: the longest, nested as deep as the header allows, on a real
worker (threads) and real Redis."""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any

import pytest

from conventions.errors import ConfigurationError
from conventions.store import batches as b
from conventions.tracing import headers as hdr
from tasks import app
from tests.integration import support_batches as jobs
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.usefixtures("clean_store")

#: ids the callbacks' ``batch_id: Id`` field refuses (most of them ``app.batch()`` took)
HOSTILE: dict[str, Any] = {
    "space": "h3 space",
    "newline": "month\n2026",
    "trailing newline": "month-2026\n",
    "braces": "{tag}",
    "unicode": "facture-été",
    "fullwidth digit": "batch-\uff11",
    "slash": "a/b",
    "nul": "a\x00b",
    "comma": "a,b",
    "pipe": "a|b",
    "empty": "",
    "129 characters": "x" * 129,
    "200 characters": "y" * 200,
    "not a string": 42,
    "none": None,
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_an_id_a_callback_cannot_carry_is_refused_at_app_batch(name: str) -> None:
    with pytest.raises(ConfigurationError, match=r"batch id .*1 to 128 letters") as info:
        app.batch(HOSTILE[name], on_complete=jobs.batch_complete.s())
    assert repr(HOSTILE[name]) in str(info.value)  # the error names the id


@pytest.mark.parametrize("name", ["space", "unicode", "129 characters"])
def test_a_nested_batch_is_held_to_the_same_rule(name: str) -> None:
    parent = app.batch("parent-ok", on_complete=jobs.batch_complete.s())
    with pytest.raises(ConfigurationError, match="1 to 128 letters"):
        parent.batch(HOSTILE[name])


def test_a_nested_id_equal_to_its_parents_or_an_ancestors_is_refused() -> None:
    root = app.batch("quarter", on_complete=jobs.batch_complete.s())
    with pytest.raises(ConfigurationError, match="'quarter' is the id of a batch it is nested in"):
        root.batch("quarter")
    month = root.batch("month")
    with pytest.raises(ConfigurationError, match=r"'quarter' is the id .*\(month in quarter\)"):
        month.batch("quarter")


def test_a_nesting_whose_cc_batch_header_would_pass_1024_characters_is_refused() -> None:
    batch = app.batch("0" * 128, on_complete=jobs.batch_complete.s())
    for level in range(1, 7):  # seven levels of 128: 902 characters, taken
        batch = batch.batch(str(level) * 128)
    assert len(",".join(batch.chain)) == 902
    batch.batch("t" * 121)  # 1,024 with it: taken
    with pytest.raises(ConfigurationError, match=f"{hdr.BATCH} header would be 1025 characters"):
        batch.batch("t" * 122)


def test_one_id_twice_in_a_tree_is_refused_at_submit_before_any_write() -> None:
    key = f"tree-{uuid.uuid4().hex[:8]}"
    root = app.batch(key, on_complete=jobs.batch_complete.s())
    for month in ("m1", "m2"):
        child = root.batch(f"{month}-{key}")
        child.batch(f"week-{key}").add(jobs.batch_item, item_id=f"{key}-{month}")
    with pytest.raises(ConfigurationError, match=f"'week-{key}' is declared twice"):
        root.submit()
    assert app.store.get_batch(key) is None  # nothing was made


def test_a_nested_id_taken_by_a_batch_of_another_parent_is_refused_at_submit() -> None:
    key = f"taken-{uuid.uuid4().hex[:8]}"
    app.store.create_batch(b.BatchSpec(f"{key}-child", ("m",), {}))  # a batch on its own
    root = app.batch(key, on_complete=jobs.batch_complete.s())
    root.add(jobs.batch_item, item_id=f"{key}-0")
    root.batch(f"{key}-child").add(jobs.batch_item, item_id=f"{key}-1")
    with pytest.raises(ConfigurationError, match=f"'{key}-child' is taken by a batch"):
        root.submit()
    assert app.store.get_batch(key) is None


@pytest.mark.usefixtures("thread_worker")
def test_the_longest_ids_nested_as_deep_as_the_header_allows_end_and_call_back() -> None:
    tag = uuid.uuid4().hex[:8]
    ids = [f"{tag}{level}".ljust(128, ":._-"[level % 4]) for level in range(7)]
    root = app.batch(ids[0], on_complete=jobs.batch_complete.s())
    batch = root
    for level, batch_id in enumerate(ids[1:], start=1):
        batch = batch.batch(batch_id, on_complete=jobs.batch_complete.s())
        batch.add(jobs.batch_item, item_id=f"{tag}-{level}")
    root.add(jobs.batch_item, item_id=f"{tag}-0")
    root.submit()

    for batch_id in ids:  # each level's callback ran once, with its batch ended
        (run,) = wait_for(partial(jobs.runs, batch_id), timeout=60)
        assert (run["which"], run["pending"], run["failed"]) == ("on_complete", 0, 0)
