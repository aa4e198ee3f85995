"""What ``pip install celery-conventions`` gets: the wheel and the sdist hold the layer
only, and their metadata is what a package index page needs, built without warnings."""

from __future__ import annotations

import re
import tarfile
import tomllib
from email.message import Message
from email.parser import Parser

from packaging.requirements import Requirement

import conventions
from tests.packaging.conftest import ROOT, Built

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
DIST_INFO = f"celery_conventions-{VERSION}.dist-info/"
SDIST_ROOT = f"celery_conventions-{VERSION}/"
#: what the sdist may hold at its top level: the layer and its metadata, nothing else
SDIST_TOP = {
    "conventions",
    "celery_conventions.egg-info",
    "PKG-INFO",
    "setup.cfg",
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "CHANGELOG.md",
    "MANIFEST.in",
}
URLS = {"Homepage", "Documentation", "Changelog", "Issues"}
CORE = {"celery", "kombu", "redis", "pydantic"}
#: each extra and the distributions it adds (pyproject.toml; docs/reference/dependencies.md)
EXTRAS = {
    "sql": {"sqlalchemy", "psycopg"},
    "sentry": {"sentry-sdk"},
    "flower": {"flower"},
    "metrics": {"prometheus-client"},
    "django": {"django", "sqlalchemy", "psycopg"},
    "testing": {"pytest", "sqlalchemy"},
    "console": {"starlette", "jinja2", "uvicorn"},
    "otel": {"opentelemetry-api"},
}


def metadata(built: Built) -> Message:
    return Parser().parsestr(built.wheel_file(f"{DIST_INFO}METADATA"))


def name(requirement: Requirement) -> str:
    return re.sub(r"[-_.]+", "-", requirement.name).lower()


def requires(meta: Message) -> dict[str | None, set[str]]:
    """Requires-Dist by extra (None: the core), as normalised distribution names."""
    found: dict[str | None, set[str]] = {}
    for line in meta.get_all("Requires-Dist") or []:
        req = Requirement(line)
        extra = None
        if req.marker is not None:
            (extra,) = re.findall(r'extra == "([^"]+)"', str(req.marker))
        found.setdefault(extra, set()).add(name(req))
    return found


def test_the_wheel_holds_the_layer_and_its_dist_info_only(built: Built) -> None:
    names = built.wheel_names()
    strays = [n for n in names if not n.startswith(("conventions/", DIST_INFO))]
    assert strays == [], f"the wheel ships more than conventions/: {strays}"
    assert "conventions/py.typed" in names
    assert "conventions/contrib/django_outbox/migrations/0001_initial.py" in names
    assert "conventions/contrib/django_outbox/migrations/__init__.py" in names
    assert "conventions/console/templates/base.html" in names  # the console's package data
    assert "conventions/console/static/console.css" in names
    assert built.wheel_file("top_level.txt").split() == ["conventions"]
    assert f"{DIST_INFO}licenses/LICENSE" in names


def test_every_module_of_the_layer_is_in_the_wheel(built: Built) -> None:
    shipped = {n for n in built.wheel_names() if n.endswith(".py")}
    source = {str(p.relative_to(ROOT)) for p in (ROOT / "conventions").rglob("*.py")}
    assert source - shipped == set()


def test_the_sdist_holds_the_layer_and_its_metadata_only(built: Built) -> None:
    with tarfile.open(built.sdist) as tar:
        names = tar.getnames()
    assert all(n.startswith(SDIST_ROOT) or n == SDIST_ROOT.rstrip("/") for n in names)
    top = {n[len(SDIST_ROOT) :].split("/")[0] for n in names if n.startswith(SDIST_ROOT)}
    top.discard("")
    assert top - SDIST_TOP == set(), f"the sdist holds more: {sorted(top - SDIST_TOP)}"
    assert {"conventions", "pyproject.toml", "LICENSE", "README.md"} <= top
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".sqlite3"))]


def test_the_build_prints_no_warning(built: Built) -> None:
    assert "SetuptoolsDeprecationWarning" not in built.log
    noisy = [line for line in built.log.splitlines() if re.search(r"warn|deprecat", line, re.I)]
    assert noisy == []


def test_the_metadata_carries_the_license_urls_and_classifiers(built: Built) -> None:
    meta = metadata(built)
    assert meta["Metadata-Version"] in {"2.4", "2.5"}
    assert meta["License-Expression"] == "MIT"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert meta["License"] is None  # the SPDX expression only, no free-text table
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert set(urls) == URLS
    assert all(
        u.startswith("https://github.com/celery-conventions/celery-conventions")
        for u in urls.values()
    )
    classifiers = set(meta.get_all("Classifier") or [])
    for wanted in (
        "Framework :: Celery",
        "Typing :: Typed",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
    ):
        assert wanted in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")]  # PEP 639: the expression
    assert meta["Requires-Python"] == ">=3.11"
    assert "celery" in (meta["Keywords"] or "")


def test_the_core_requires_what_a_redis_user_needs_and_each_extra_its_own(built: Built) -> None:
    meta = metadata(built)
    found = requires(meta)
    assert found[None] == CORE
    for extra, dists in EXTRAS.items():
        assert found[extra] == dists, extra
    assert found["all"] == set().union(*EXTRAS.values())
    assert set(meta.get_all("Provides-Extra") or []) == {
        *EXTRAS, "all", "dev", "bench", "docker-smoke",
    }  # fmt: skip
    # celery[redis]: kombu 5.7 refuses redis-py < 6.1 at run time
    (celery,) = [
        Requirement(r) for r in meta.get_all("Requires-Dist") or [] if r.startswith("celery")
    ]
    assert celery.extras == {"redis"}


def test_dev_installs_everything_all_does(built: Built) -> None:
    """The tests and the reference app use every extra: ``pip install -e '.[dev]'`` (make
    install) must bring them."""
    found = requires(metadata(built))
    assert found["all"] <= found["dev"]
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = declared["optional-dependencies"]
    assert set(extras["all"]) <= set(extras["dev"])


def test_the_commands_are_declared(built: Built) -> None:
    points = built.wheel_file("entry_points.txt")
    assert "conventions = conventions.cli.main:main" in points
    assert "[celery.commands]" in points


def test_the_package_says_the_version_the_distribution_has() -> None:
    assert conventions.__version__ == VERSION
