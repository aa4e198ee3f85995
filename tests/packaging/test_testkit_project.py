"""The test kit as a user gets it: the wheel with its ``sql`` and ``testing`` extras in a
fresh venv, beside a copy of ``examples/testkit`` (a shop with its own ``tasks``,
``celeryconfig`` and ``tests``). pytest loads the kit's plugin from the installed entry
point, and the shop's own tests pass: one per helper of the kit, the real worker included,
in seconds."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import conventions
from tests.packaging.conftest import (
    ROOT,
    Built,
    Venv,
    clean_env,
    redis_url,
    tree_hashes,
    venv_beside,
)

SHOP = ROOT / "examples" / "testkit"


@pytest.fixture(scope="module")
def shop_venv(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    """A fresh venv with ``celery-conventions[sql,testing]`` from the wheel, beside a copy
    of the shop."""
    yield venv_beside(SHOP, tmp_path_factory.mktemp("shop"), built, "[sql,testing]")


def test_pytest_loads_the_kits_plugin_from_the_installed_entry_point(shop_venv: Venv) -> None:
    done = shop_venv.run(
        str(shop_venv.python), "-m", "pytest", "--fixtures", "-p", "no:cacheprovider",
        cwd=shop_venv.project,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    version = re.escape(conventions.__version__)
    assert re.search(rf"^plugins: .*\bcelery-conventions-{version}(?:\s|,|$)", done.stdout, re.M)
    for fixture in ("cc_kit", "cc_clock", "cc_worker", "cc_store_url"):
        assert re.search(rf"^{fixture}\b.*conventions/testing/plugin\.py", done.stdout, re.M)


def test_dash_p_conventions_loads_the_plugin_where_autoloading_is_off(shop_venv: Venv) -> None:
    args = (str(shop_venv.python), "-m", "pytest", "--fixtures", "-p", "no:cacheprovider")
    off = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    without = shop_venv.run(*args, cwd=shop_venv.project, env=off)
    assert not re.search(r"^cc_kit\b", without.stdout, re.M)
    done = shop_venv.run(*args, "-p", "conventions", cwd=shop_venv.project, env=off)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^cc_kit\b.*conventions/testing/plugin\.py", done.stdout, re.M)


def test_the_shops_tests_pass_from_the_installed_wheel_in_seconds(
    shop_venv: Venv, broker_redis: redis.Redis, store_redis: redis.Redis
) -> None:
    env = {
        "CC_TEST_BROKER_URL": redis_url(broker_redis),
        "CC_TEST_REDIS_URL": redis_url(store_redis),
    }
    started = time.monotonic()
    done = shop_venv.run(
        str(shop_venv.python), "-m", "pytest", "-p", "no:cacheprovider", "-v",
        cwd=shop_venv.project, env=env,
    )  # fmt: skip
    took = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    names = sorted(re.findall(r"^tests/\S+::(test_\w+) PASSED", output, re.M))
    expected = sorted(
        name
        for path in (SHOP / "tests").glob("test_*.py")
        for name in re.findall(r"^def (test_\w+)\(", path.read_text(), re.M)
    )
    assert names == expected, output
    assert "SKIPPED" not in output
    print(f"the shop's {len(names)} tests ran in {took:.1f}s (interpreter start included)")


def test_the_shops_tests_leave_its_files_as_they_were(shop_venv: Venv) -> None:
    caches = [p for p in shop_venv.project.rglob("*") if ".pytest_cache" in p.parts]
    assert not caches
    assert {
        k: v for k, v in tree_hashes(shop_venv.project).items() if "__pycache__" not in k
    } == shop_venv.project_before


def test_the_shop_type_checks_against_the_installed_wheel(shop_venv: Venv, tmp_path: Path) -> None:
    """mypy strict on the shop and its tests, seeing the layer and the kit as the wheel
    installed them (``py.typed``): ``cc_kit`` and ``Run`` are typed for the user."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--python-executable", str(shop_venv.python),
         "--cache-dir", str(tmp_path / "mypy-cache")],
        cwd=shop_venv.project, env=clean_env(), capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"Success: no issues found in \d+ source files", done.stdout)
