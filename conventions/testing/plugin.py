"""The pytest plugin of the test kit: fixtures only.

Installed with the ``testing`` extra, pytest loads it by itself (the ``pytest11`` entry
point ``conventions``); a project can also name it (``-p conventions.testing.plugin``, or
``pytest_plugins = ["conventions.testing.plugin"]`` in its ``conftest.py``).

Loading it does nothing else: no signal is connected, no setting touched, no connection
opened. Everything happens in the fixtures a test asks for, all named ``cc_*``:

* ``cc_app``: the app under test, from the ``cc_app`` ini setting or ``--cc-app``
  (``"tasks:app"``); or override the fixture in your ``conftest.py``;
* ``cc_kit``: a :class:`~conventions.testing.kit.JobKit` for the test: the app isolated
  (memory broker, in-memory results, a store of the test's own), a capture, a virtual
  clock, the backoff jitter seeded;
* ``cc_clock``: the kit's virtual clock; ``cc_start``: where it starts (override it);
* ``cc_store_url``: the test's store: a SQLite file under ``tmp_path`` (the ``testing``
  extra brings SQLAlchemy), or the Redis database ``cc_redis_url`` (emptied first);
* ``cc_redis_url``, ``cc_broker_url``: Redis databases the tests own (``--cc-redis-url``
  / ``CC_TEST_REDIS_URL``, ``--cc-broker-url`` / ``CC_TEST_BROKER_URL``; override them
  to use pytest-celery's containers);
* ``cc_worker``: a real Celery worker in a thread on those two databases.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from conventions.config import apps

if TYPE_CHECKING:
    from conventions.testing.clock import VirtualClock
    from conventions.testing.kit import JobKit


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conventions", "celery-conventions test kit")
    group.addoption("--cc-app", default=None, help="the app under test, as 'module:attribute'")
    group.addoption(
        "--cc-redis-url", default=None,
        help="a Redis database the tests own for the store (default: SQLite per test)",
    )  # fmt: skip
    group.addoption(
        "--cc-broker-url", default=None, help="a Redis database the tests own for cc_worker"
    )
    group.addoption(
        "--cc-seed", type=int, default=None, help="the backoff jitter's seed (default 0)"
    )
    parser.addini("cc_app", "the app under test, as 'module:attribute'", default="")


def _option(config: pytest.Config, name: str, env: str) -> str | None:
    value = config.getoption(name) or os.environ.get(env)
    return str(value) if value else None


#: what to do when the app's own module is not on the path (a project not installed)
PYTHONPATH_HINT = (
    "the app under test (cc_app = {spec!r}) cannot be imported: no module named "
    "{missing!r} on pytest's path. A project that is not installed (no `pip install -e .`) "
    'puts its root on the path: pythonpath = ["."] in the [tool.pytest.ini_options] of '
    "pyproject.toml (docs: Test your jobs)"
)


def _app_module_missing(spec: str, exc: BaseException) -> str | None:
    """The module of ``spec`` that ``exc`` says is missing (the app's own package, not a
    dependency it imports), else None."""
    module = spec.partition(":")[0]
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    if missing and (module == missing or module.startswith(f"{missing}.")):
        return str(missing)
    return None


def _kit_app(spec: str) -> Any:
    """The object ``"module:attribute"`` names (:func:`conventions.config.apps.import_spec`);
    a usage error saying how to put the project on the path when its module is not."""
    try:
        return apps.import_spec(spec)
    except ModuleNotFoundError as exc:
        missing = _app_module_missing(spec, exc)
        if missing is None:
            raise
        raise pytest.UsageError(PYTHONPATH_HINT.format(spec=spec, missing=missing)) from exc


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """A test module that cannot import the app's package (``from tasks import ...`` in a
    project not installed) gets the same hint beside its collection error."""
    report = yield
    spec = collector.config.getoption("--cc-app") or collector.config.getini("cc_app")
    if report.failed and spec:
        module = str(spec).partition(":")[0].split(".")[0]
        if f"No module named '{module}'" in str(report.longrepr):
            hint = PYTHONPATH_HINT.format(spec=str(spec), missing=module)
            report.sections.append(("conventions test kit", hint))
    return report


@pytest.fixture
def cc_app(request: pytest.FixtureRequest) -> Any:
    """The app under test (``cc_app`` ini setting or ``--cc-app``; or override this)."""
    spec = request.config.getoption("--cc-app") or request.config.getini("cc_app")
    if not spec:
        raise pytest.UsageError(
            "the conventions test kit needs your app: set cc_app = 'tasks:app' in the "
            "[tool.pytest.ini_options] of pyproject.toml (or pass --cc-app), or define "
            "a cc_app fixture that returns it"
        )
    return _kit_app(str(spec))


@pytest.fixture
def cc_start() -> datetime | None:
    """Where the virtual clock starts (None: now, to the second). Override it."""
    return None


@pytest.fixture
def cc_redis_url(request: pytest.FixtureRequest) -> str | None:
    """A Redis database the tests own, for the store (``--cc-redis-url`` or
    ``CC_TEST_REDIS_URL``; None: none). Override it to use another one (pytest-celery's
    container, say)."""
    return _option(request.config, "--cc-redis-url", "CC_TEST_REDIS_URL")


@pytest.fixture
def cc_broker_url(request: pytest.FixtureRequest) -> str | None:
    """A Redis database the tests own, for ``cc_worker``'s broker (``--cc-broker-url`` or
    ``CC_TEST_BROKER_URL``; None: none). Override it like ``cc_redis_url``."""
    return _option(request.config, "--cc-broker-url", "CC_TEST_BROKER_URL")


@pytest.fixture
def cc_store_url(cc_redis_url: str | None, tmp_path: Path) -> str:
    """The test's own store: the Redis database ``cc_redis_url`` (emptied first), else a
    SQLite file under ``tmp_path``."""
    if cc_redis_url:
        return cc_redis_url
    return f"sqlite:///{tmp_path / 'conventions-store.db'}"


@pytest.fixture
def cc_kit(
    request: pytest.FixtureRequest, cc_app: Any, cc_store_url: str, cc_start: datetime | None
) -> Iterator[JobKit]:
    """The test kit of this test (see :class:`conventions.testing.kit.JobKit`)."""
    from conventions.testing.kit import DEFAULT_SEED, JobKit

    seed = request.config.getoption("--cc-seed")
    with JobKit.open(
        cc_app, store_url=cc_store_url, start=cc_start,
        seed=int(seed) if seed is not None else DEFAULT_SEED,
    ) as kit:  # fmt: skip
        yield kit


@pytest.fixture
def cc_clock(cc_kit: JobKit) -> VirtualClock:
    """The virtual clock of the test's kit."""
    return cc_kit.clock


@pytest.fixture
def cc_worker(cc_app: Any, cc_broker_url: str | None, cc_redis_url: str | None) -> Iterator[Any]:
    """A real worker of the app, in a thread, on Redis databases the test owns."""
    from conventions.testing.worker import real_worker

    if not (cc_broker_url and cc_redis_url):
        missing = (
            "cc_worker needs two Redis databases the tests own: --cc-broker-url and "
            "--cc-redis-url (or CC_TEST_BROKER_URL and CC_TEST_REDIS_URL)"
        )
        if os.environ.get("CI"):  # skipped on a laptop, never in CI
            pytest.fail(missing)
        pytest.skip(missing)
    with real_worker(cc_app, broker_url=cc_broker_url, store_url=cc_redis_url) as worker:
        yield worker
