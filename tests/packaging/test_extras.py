"""``conventions.config.extras``: the map of the extras matches pyproject.toml, and a
missing module becomes one line naming the extra (in this venv, where every extra is
installed: a module that does not exist stands for the missing one)."""

from __future__ import annotations

import sys
import tomllib

import pytest

from conventions.config import extras
from conventions.errors import MissingExtra
from tests.packaging.conftest import OPTIONAL, ROOT


def test_the_map_of_extras_is_pyprojects() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = declared["optional-dependencies"]
    assert set(extras.EXTRAS) == set(optional) - {"all", "dev", "bench", "docker-smoke"}
    modules = {m for provided in extras.EXTRAS.values() for m in provided}
    assert modules <= set(OPTIONAL)


def test_require_names_the_extra_of_a_missing_module() -> None:
    with pytest.raises(MissingExtra) as raised:
        extras.require("cc_no_such_module", "metrics", "the Prometheus exporter")
    assert str(raised.value) == (
        "the Prometheus exporter needs the 'metrics' extra: "
        "pip install 'celery-conventions[metrics]'"
    )
    assert raised.value.extra == "metrics"
    assert isinstance(raised.value.__cause__, ModuleNotFoundError)


def test_require_returns_an_installed_module() -> None:
    assert extras.require("json", "sql", "anything").__name__ == "json"


def test_loaded_never_imports() -> None:
    sys.modules.pop("cc_absent", None)
    assert extras.loaded("cc_absent") is None
    assert extras.loaded("conventions") is sys.modules["conventions"]
