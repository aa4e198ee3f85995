"""An idempotency key in either of its two forms, for the people who type and read them.

The body (``ctx.idempotency_key``), the providers it calls and the run history hold a
task's key **bare** (``charge:inv_4004``); the store keeps it under the task's
**namespace** (``billing.charge_invoice:charge:inv_4004``, :func:`conventions.store.keys.
namespaced`), and so does a dead letter. An operator copies whichever one is in front of
them: every filter and look-up takes either (:func:`same_key`, :func:`store_forms`,
:func:`bare_forms`), and where a key is shown both are shown, labelled (:func:`both`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from conventions.store.keys import bare, namespace, namespaced


def job_names(app: Any) -> list[str]:
    """The names of ``app``'s convention jobs (the namespaces a key may carry)."""
    return sorted(
        name for name, task in app.tasks.items() if getattr(task, "conventions_job", False)
    )


def _namespaces(task_names: Iterable[str]) -> list[str]:
    return sorted({namespace(name) for name in task_names})


def carried(query: str, task_names: Iterable[str]) -> list[str]:
    """The namespaces of ``task_names`` that ``query`` starts with (usually none or one)."""
    return [space for space in _namespaces(task_names) if query.startswith(f"{space}:")]


def same_key(task_name: str, stored: str | None, query: str) -> bool:
    """Is ``query`` (either form) the key ``stored`` (either form) of a ``task_name`` job?"""
    return stored is not None and namespaced(task_name, stored) == namespaced(task_name, query)


def store_forms(query: str, task_names: Iterable[str]) -> list[str]:
    """The store keys ``query`` may stand for: itself when it carries a job's namespace
    (or names no job: a key of the operator's own), else itself under each job's."""
    names = list(task_names)
    if carried(query, names):
        return [query]
    return [query, *(f"{space}:{query}" for space in _namespaces(names))]


def bare_forms(query: str, task_names: Iterable[str]) -> list[str]:
    """The bare keys ``query`` may stand for: itself, and itself without a job's
    namespace when it carries one."""
    forms = [query]
    forms += [query[len(space) + 1 :] for space in carried(query, task_names)]
    return list(dict.fromkeys(forms))


def both(task_name: str, key: str | None) -> tuple[str, str]:
    """``(bare, stored)``: the key as the body sees it and as the store keeps it."""
    if not key:
        return "-", "-"
    return bare(task_name, key), namespaced(task_name, key)


def list_runs(
    store: Any, task_names: Iterable[str], key: str | None, *, limit: int, **filters: Any
) -> list[Any]:
    """``store.list_runs`` with ``key`` in either form (the history keeps it bare): one
    read per bare form, the runs of another job whose bare key happens to match the
    namespaced form's tail left out. Newest first."""
    if not key:
        return list(store.list_runs(limit=limit, **filters))
    found = {
        run.id: run
        for form in bare_forms(key, task_names)
        for run in store.list_runs(key=form, limit=limit, **filters)
        if same_key(run.task, run.key, key)
    }
    return sorted(found.values(), key=lambda run: run.created_at, reverse=True)[:limit]
