"""The release table the mixed-fleet chaos runs resolve a release from
(``tests/acceptance/releases.py``): checked in ``make test``, so a wrong sha fails in
seconds, not after a chaos run's build."""

from __future__ import annotations

import pytest

from tests.acceptance import releases


@pytest.mark.parametrize("tag", sorted(releases.RELEASES))
def test_every_release_is_an_ancestor_of_head_and_matches_its_tag_when_the_clone_has_it(
    tag: str,
) -> None:
    assert releases.commit_of(tag) == releases.RELEASES[tag]


def test_a_tag_that_names_another_commit_than_the_table_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    head = releases._git("rev-parse", "HEAD~1").stdout.strip()
    monkeypatch.setitem(releases.RELEASES, "v-test", head)
    real = releases._git

    def tagged(*args: str) -> object:
        if args[:1] == ("rev-parse",) and "refs/tags/v-test^{commit}" in args:
            return real("rev-parse", "HEAD")  # the "tag" names HEAD, the table HEAD~1
        return real(*args)

    monkeypatch.setattr(releases, "_git", tagged)
    with pytest.raises(AssertionError, match="update RELEASES"):
        releases.commit_of("v-test")


def test_the_previous_release_is_in_the_table() -> None:
    assert releases.PREVIOUS in releases.RELEASES
