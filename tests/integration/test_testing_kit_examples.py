"""The test kit cannot pass a broken job: the example project's own tests
(``examples/testkit/tests``, the files docs/howto/test-your-jobs.md shows) pass on the
project as it is, and fail on copies whose job has a wrong key template, a wrong error
class or a wrong payload rule.

Each run is ``pytest`` in a subprocess, in a copy of the project, with this repository's
``conventions`` (the packaging tests run the same files from the installed wheel). The
files the page shows, as modules (each run here): ``examples.testkit.tests.conftest``,
``examples.testkit.tests.test_receipts``, ``examples.testkit.tests.test_outbox``,
``examples.testkit.tests.test_schedule``, ``examples.testkit.tests.test_imports``,
``examples.testkit.tests.test_worker`` and the job they test,
``examples.testkit.tasks.receipts``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "examples" / "testkit"
HOWTO = ROOT / "docs" / "howto" / "test-your-jobs.md"
#: what the suite's own processes set that must not reach the project's
LEAKY_PREFIXES = ("CELERY", "CONVENTIONS_", "SHOP_", "CC_TEST_", "PYTEST_ADDOPTS")
LEAKY = {"REDIS_URL", "DATABASE_URL", "SENTRY_DSN", "DJANGO_SETTINGS_MODULE"}
RECEIPTS = "tasks/receipts.py"


@dataclass(frozen=True)
class Outcome:
    code: int
    output: str

    def failed(self) -> set[str]:
        return set(re.findall(r"^FAILED (tests/\S+?)(?: - |$)", self.output, re.M))

    def passed(self) -> int:
        found = re.search(r"(\d+) passed", self.output)
        return int(found.group(1)) if found else 0


#: the plugin, named: entry points are not loaded (whether the distribution's entry point
#: is visible depends on how this repository was installed, and on the working folder)
PLUGIN = ("-p", "conventions.testing.plugin")


def run_suite(project: Path, env: dict[str, str] | None = None, *args: str) -> Outcome:
    clean = {
        k: v for k, v in os.environ.items() if k not in LEAKY and not k.startswith(LEAKY_PREFIXES)
    }
    clean["PYTHONPATH"] = os.pathsep.join(
        [str(project), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PLUGIN, *args],
        cwd=project, env={**clean, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", **(env or {})},
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    return Outcome(done.returncode, done.stdout + done.stderr)


def copy_project(tmp_path: Path) -> Path:
    project = tmp_path / "shop"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("__pycache__", ".venv"))
    return project


def mutate(project: Path, path: str, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` in the project's file ``path`` (exactly once)."""
    target = project / path
    text = target.read_text()
    assert text.count(old) == 1, f"{path} no longer holds {old!r}: update the mutation"
    target.write_text(text.replace(old, new))


def url_of(client: redis.Redis) -> str:
    kw = client.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/{kw['db']}"


def test_the_example_suite_passes_with_a_real_worker_too(
    broker_redis: redis.Redis, store_redis: redis.Redis, tmp_path: Path
) -> None:
    project = copy_project(tmp_path)
    env = {"CC_TEST_BROKER_URL": url_of(broker_redis), "CC_TEST_REDIS_URL": url_of(store_redis)}
    outcome = run_suite(project, env)
    assert outcome.code == 0, outcome.output
    assert outcome.passed() == len(example_tests()) and "skipped" not in outcome.output


def test_the_example_suite_passes_on_sqlite_stores_without_any_server(tmp_path: Path) -> None:
    project = copy_project(tmp_path)
    outcome = run_suite(project, None, "--deselect", "tests/test_worker.py")
    assert outcome.code == 0, outcome.output
    assert outcome.passed() == len(example_tests()) - 1


MUTATIONS = {
    # a key too coarse: one receipt per customer instead of one per order
    "key template": (
        'key="receipt:{order_id}"',
        'key="receipt:{customer_id}"',
        {
            "tests/test_receipts.py::test_a_receipt_is_sent_once_under_the_orders_key",
            "tests/test_receipts.py::test_after_three_outages_the_fourth_attempt_sends_it",
            "tests/test_receipts.py::test_a_second_delay_of_the_same_order_enqueues_one_job",
            "tests/test_receipts.py::test_two_orders_of_one_customer_get_two_receipts",
            "tests/test_outbox.py::test_a_committed_order_publishes_its_receipt_through_the_relay",
        },
    ),
    # the provider's errors the wrong way round: outages dead-letter, refusals retry
    "error class": (
        'errors={Unavailable: "transient", MailboxUnknown: "permanent"}',
        'errors={Unavailable: "permanent", MailboxUnknown: "transient"}',
        {
            "tests/test_receipts.py::test_after_three_outages_the_fourth_attempt_sends_it",
            "tests/test_receipts.py::test_an_unknown_mailbox_is_dead_lettered_at_once",
        },
    ),
    # a payload rule loosened: a receipt without its customer would be enqueued
    "payload": (
        "    customer_id: Id\n",
        "    customer_id: Id | None = None\n",
        {
            "tests/test_receipts.py::test_a_call_without_its_customer_is_refused_and_enqueues_nothing"
        },
    ),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_example_suite_fails_on_a_broken_job(mutation: str, tmp_path: Path) -> None:
    old, new, expected = MUTATIONS[mutation]
    project = copy_project(tmp_path)
    mutate(project, RECEIPTS, old, new)
    outcome = run_suite(project, None, "--deselect", "tests/test_worker.py")
    assert outcome.code == 1, outcome.output
    assert outcome.failed() == expected, outcome.output


def example_tests() -> list[str]:
    """The example project's test functions, as ``file::name``."""
    found = []
    for path in sorted((PROJECT / "tests").glob("test_*.py")):
        names = re.findall(r"^def (test_\w+)\(", path.read_text(), re.M)
        found += [f"tests/{path.name}::{name}" for name in names]
    return found


def test_the_how_to_shows_every_example_test_file_whole() -> None:
    """Each file is a block of the page (``<!-- example: ... -->``), which
    tests/unit/test_docs_examples.py compares byte for byte."""
    page = HOWTO.read_text()
    for path in sorted((PROJECT / "tests").glob("test_*.py")):
        marker = f"<!-- example: examples/testkit/tests/{path.name} -->"
        assert marker in page, f"{HOWTO.name} does not show {path.name}"
        module = f"examples.testkit.tests.{path.stem}"
        assert module in (__doc__ or ""), f"name {module} in this module's docstring"
