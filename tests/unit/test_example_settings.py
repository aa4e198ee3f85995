"""Every example's ``celeryconfig.py`` uses Celery's current setting names: a module
variable named like an old setting (``BROKER_URL``) makes Celery warn that the old names
are deprecated (at each worker's start: ``Settings.maybe_warn_deprecated_settings``, what
``celery worker`` calls), in every adopter's project copied from it."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from types import ModuleType

import pytest
from celery import Celery

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = [ROOT / "celeryconfig.py", *sorted(ROOT.glob("examples/**/celeryconfig.py"))]


def _load(path: Path) -> ModuleType:
    name = "example_config_" + "_".join(path.relative_to(ROOT).parts[:-1])
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_are_example_settings_to_check() -> None:
    assert len(CONFIGS) >= 3


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_an_example_config_loads_without_a_deprecated_setting_name(path: Path) -> None:
    app = Celery("example_settings", set_as_current=False)
    app.config_from_object(_load(path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert app.conf.broker_url
        assert not app.conf.deprecated_settings
        assert app.conf.maybe_warn_deprecated_settings() is False
