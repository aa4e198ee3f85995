"""Build a release's sdist and wheel from its git tag, never from the working tree.

    python scripts/release.py check v0.1.0      # the tag, its version and its changelog agree
    python scripts/release.py build v0.1.0      # dist/v0.1.0/: sdist, wheel, SHA256SUMS

``build`` exports the tagged commit with ``git archive`` into a temporary folder (so
nothing uncommitted or untracked can slip into a release), checks it, and runs
``python -m build`` there. The rules a release follows (semantic versioning, what a minor
and a patch may change, the deprecation policy) are in docs/reference/compatibility.md;
``make release TAG=v0.1.0`` runs ``build``.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TAG = re.compile(r"^v(\d+\.\d+\.\d+)$")


def _git(*args: str) -> bytes:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True).stdout


def version_of(tag: str) -> str:
    """``v0.1.0`` -> ``0.1.0``; anything else is not a release tag."""
    match = TAG.match(tag)
    if not match:
        raise SystemExit(f"{tag!r} is not a release tag (vMAJOR.MINOR.PATCH)")
    return match.group(1)


def problems(tag: str) -> list[str]:
    """What is wrong with the tagged commit as a release (empty: nothing)."""
    version = version_of(tag)
    try:
        commit = _git("rev-parse", "--verify", f"{tag}^{{commit}}").decode().strip()
    except subprocess.CalledProcessError:
        return [f"no tag {tag} in this repository (git fetch --tags?)"]
    found = []
    project = tomllib.loads(_git("show", f"{commit}:pyproject.toml").decode())
    if project["project"]["version"] != version:
        found.append(
            f"pyproject.toml at {tag} says version {project['project']['version']}, not {version}"
        )
    changelog = _git("show", f"{commit}:CHANGELOG.md").decode()
    if not re.search(rf"^## \[{re.escape(version)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M):
        found.append(f"CHANGELOG.md at {tag} has no '## [{version}] - YYYY-MM-DD' section")
    return found


def build(tag: str, out: Path) -> list[Path]:
    """The sdist and the wheel of ``tag`` in ``out``, with their SHA256SUMS."""
    found = problems(tag)
    if found:
        raise SystemExit("\n".join(found))
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="release-") as tmp:
        source = Path(tmp) / "source"
        with tarfile.open(fileobj=BytesIO(_git("archive", "--format=tar", tag))) as tar:
            tar.extractall(source, filter="data")
        subprocess.run(
            [sys.executable, "-m", "build", "--outdir", str(out), str(source)],
            check=True,
            capture_output=True,
        )
    artifacts = sorted(p for p in out.iterdir() if p.suffix in {".whl", ".gz"})
    sums = "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in artifacts)
    (out / "SHA256SUMS").write_text(sums)
    return artifacts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["check", "build"])
    parser.add_argument("tag")
    parser.add_argument("--out", type=Path, default=None, help="default: dist/<tag>/")
    args = parser.parse_args(argv)
    if args.command == "check":
        found = problems(args.tag)
        print("\n".join(found) or f"{args.tag}: tag, version and changelog agree")
        return 1 if found else 0
    for path in build(args.tag, args.out or ROOT / "dist" / args.tag):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
