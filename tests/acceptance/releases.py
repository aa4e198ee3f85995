"""The releases of the layer that a fleet may still run beside HEAD, by commit.

A clean clone in CI may not carry tags, so the mixed-fleet tests resolve a release from
this table: its commit is an ancestor of main, hence in any clone of main. Where the tag
exists (a developer's clone, the release machine), :func:`commit_of` checks that it names
the same commit, so the table cannot drift from the tag.

A release's runtime (its wheel, in a venv of its own) is built by
:mod:`tests.acceptance.support_release`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: tag -> the commit it names (a new release: its line here, and PREVIOUS moves to it)
RELEASES: dict[str, str] = {
    "v0.1.0": "7404c54287932029774183efc80b1a41c6cbc1e0",
}
#: the release a fleet rolls from: the newest one (one minor version back from HEAD)
PREVIOUS = "v0.1.0"


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60, check=False
    )


def commit_of(tag: str) -> str:
    """The commit of release ``tag``, from :data:`RELEASES`; checked against the git tag
    when the clone has it, and present in the clone (an ancestor of HEAD)."""
    sha = RELEASES[tag]
    tagged = _git("rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}")
    if tagged.returncode == 0 and tagged.stdout.strip() != sha:
        raise AssertionError(
            f"tag {tag} names {tagged.stdout.strip()}, but tests/acceptance/releases.py "
            f"says {sha}: update RELEASES"
        )
    ancestor = _git("merge-base", "--is-ancestor", sha, "HEAD")
    if ancestor.returncode != 0:
        raise AssertionError(
            f"release {tag} ({sha}) is not an ancestor of HEAD in {ROOT} "
            f"(a shallow clone? fetch with --unshallow): {ancestor.stderr.strip()}"
        )
    return sha
