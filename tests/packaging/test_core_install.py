"""The core install (the wheel, no extra): the layer imports none of the extras' modules,
and a feature whose extra is missing says which one, in one line, where it is used."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.packaging.conftest import OPTIONAL, Venv

#: what a web process that publishes, and a worker, import of the layer
CORE_MODULES = (
    "conventions",
    "conventions.app",
    "conventions.task",
    "conventions.store",
    "conventions.store.redis",
    "conventions.transport.redis",
    "conventions.results.redis",
    "conventions.worker.consumer",
    "conventions.worker.signals",
    "conventions.observability.alerts",
    "conventions.ops.exporter",
    "conventions.ops.doctor",
    "conventions.ops.retention",
    "conventions.schedules.beat",
    "conventions.contrib.web",
    "conventions.config.extras",
)

IMPORTS = f"""
import importlib, json, sys
for name in {CORE_MODULES!r}:
    importlib.import_module(name)
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}})))
"""


def test_the_core_imports_none_of_the_extras(venv: Venv, tmp_path: Path) -> None:
    done = venv.python_code(IMPORTS, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    assert "conventions" in loaded
    assert loaded & set(OPTIONAL) == set()


def test_the_core_install_has_none_of_the_extras(venv: Venv, tmp_path: Path) -> None:
    """The modules are absent, not merely unimported: what follows tests a real miss."""
    code = f"import importlib.util as u; print([m for m in {OPTIONAL!r} if u.find_spec(m)])"
    done = venv.python_code(code, cwd=tmp_path)
    assert done.stdout.strip() == "[]", done.stderr


#: each feature of an extra, used in the core install: (id, code, extra, feature)
FEATURES = [
    ("open_store-postgresql",
     "from conventions.store import open_store; open_store('postgresql://u@127.0.0.1/x')",
     "sql", "the SQL store"),
    ("open_store-sqlite", "from conventions.store import open_store; open_store('sqlite:///x.db')",
     "sql", "the SQL store"),
    ("SQLStore", "from conventions.store import SQLStore", "sql", "the SQL store"),
    ("once", "from conventions.transactional.once import once", "sql", "once()"),
    ("outbox", "from conventions.transactional import outbox", "sql", "the outbox"),
    ("relay", "from conventions.transactional.relay import Relay", "sql", "the outbox relay"),
    ("console", "from conventions.console import console_app", "console", "the operator's console"),
    ("otel", "from conventions.tracing import spans; spans.use(None)", "otel",
     "OpenTelemetry traces"),
    ("exporter",
     "from conventions import App; from conventions.ops import exporter; "
     "exporter.Exporter(App('x', set_as_current=False))",
     "metrics", "the Prometheus exporter"),
    ("init_sentry",
     "from conventions.observability import alerts; alerts.init_sentry('https://k@h.invalid/1')",
     "sentry", "Sentry reporting"),
]  # fmt: skip

#: runs every use in one interpreter (a failed import leaves nothing behind in sys.modules)
USES = """
import json, sys
from conventions.errors import MissingExtra
out = {}
for name, code in json.loads(sys.argv[1]).items():
    try:
        exec(code, {})
    except MissingExtra as exc:
        out[name] = {"extra": exc.extra, "message": str(exc),
                     "import": isinstance(exc, ImportError)}
    else:
        out[name] = None
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def raised(venv: Venv, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    codes = json.dumps({name: code for name, code, _, _ in FEATURES})
    done = venv.run(str(venv.python), "-c", USES, codes, cwd=tmp_path_factory.mktemp("features"))
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


@pytest.mark.parametrize(
    ("name", "extra", "feature"),
    [(name, extra, feature) for name, _, extra, feature in FEATURES],
    ids=[name for name, *_ in FEATURES],
)
def test_a_feature_without_its_extra_names_the_extra_in_one_line(
    raised: dict[str, Any], name: str, extra: str, feature: str
) -> None:
    error = raised[name]
    assert error is not None, f"{name}: no MissingExtra in the core install"
    assert error["extra"] == extra
    assert error["message"] == (
        f"{feature} needs the {extra!r} extra: pip install 'celery-conventions[{extra}]'"
    )
    assert "\n" not in error["message"]
    assert error["import"] is True  # `except ImportError` guards keep working


def test_without_sentry_an_alert_is_a_log_line_and_no_error(venv: Venv, tmp_path: Path) -> None:
    code = (
        "import logging, sys\n"
        "logging.basicConfig(stream=sys.stdout, format='%(levelname)s %(message)s')\n"
        "from conventions.observability import alerts\n"
        "alerts.alert('job x dead-lettered', exc=None, tags={'task': 't.v1'})\n"
        "print('sentry' in ' '.join(sys.modules))\n"
        "print(alerts.init_sentry(None))\n"
    )
    done = venv.python_code(code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["ERROR job x dead-lettered", "False", "False"]
