"""Every released version of every reference task still accepts its frozen payloads.

Messages outlive deploys: a payload published by an old release may sit in a queue
while the new release starts. Each ``payloads/<task name>.json`` holds payloads as that
version published them; a task name may not disappear while its file exists.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conventions import ConventionTask
from tasks import app

FROZEN = Path(__file__).parent / "payloads"
REFERENCE = sorted(
    name
    for name, task in app.tasks.items()
    if isinstance(task, ConventionTask) and not name.startswith("testing.")
)


def test_every_reference_task_version_has_frozen_payloads() -> None:
    frozen = sorted(path.stem for path in FROZEN.glob("*.json"))
    assert frozen == REFERENCE


@pytest.mark.parametrize("path", sorted(FROZEN.glob("*.json")), ids=lambda p: p.stem)
def test_frozen_payloads_still_validate_and_keep_their_idempotency_key(path: Path) -> None:
    task = app.tasks[path.stem]
    assert isinstance(task, ConventionTask)
    for data in json.loads(path.read_text()):
        payload = task.upcast_payload(task.payload.parse(data, task=task.name))
        key = (task.upcast_into or task).key_for(payload)
        assert key and "{" not in key
