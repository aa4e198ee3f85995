"""The reference pages cannot drift from the code: every CLI command and option, every
setting and environment variable, every module of ``conventions`` is on its page.

The CLI is read from the real click group; the settings and variables from the
source of ``conventions/`` and ``celeryconfig.py`` (their ``ast``), so a new one that is
not documented fails here, naming what is missing and where to write it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from conventions.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
CLI_PAGE = ROOT / "docs" / "reference" / "cli.md"
SETTINGS_PAGE = ROOT / "docs" / "reference" / "settings.md"
ARCHITECTURE_PAGE = ROOT / "docs" / "discussions" / "architecture.md"
#: a command's section: ``### `conventions dlq list` ``
COMMAND_HEADING = re.compile(r"^#{2,4} `(conventions(?: [a-z-]+)*)`\s*$", re.M)


# -- the CLI -------------------------------------------------------------------------------
def leaf_commands(
    command: click.Command, path: tuple[str, ...] = ("conventions",)
) -> Iterator[tuple[str, click.Command]]:
    """Every runnable command (one without subcommands, or a group that runs on its own:
    ``conventions queues``) and its click command."""
    if not isinstance(command, click.Group) or command.invoke_without_command:
        yield " ".join(path), command
    if not isinstance(command, click.Group):
        return
    for name, sub in command.commands.items():
        yield from leaf_commands(sub, (*path, name))


def own_arguments(command: click.Command) -> list[str]:
    """How each parameter is written on the command line: ``--task``, or ``ID`` (the
    argument's metavar), leaving out ``--help``."""
    out: list[str] = []
    for param in command.params:
        if isinstance(param, click.Option):
            out.extend(o for o in param.opts if o.startswith("--"))
        else:
            out.append(str(param.metavar or param.name).upper().removesuffix("..."))
    return out


def cli_sections() -> dict[str, str]:
    """The CLI page's sections, by the command of their heading."""
    text = CLI_PAGE.read_text()
    headings = list(COMMAND_HEADING.finditer(text))
    sections = {}
    for heading, following in zip(headings, [*headings[1:], None], strict=True):
        end = following.start() if following else len(text)
        sections[heading.group(1)] = text[heading.end() : end]
    return sections


def mentions(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


COMMANDS = dict(leaf_commands(cli))


def test_the_command_walk_finds_every_command_group() -> None:
    groups = {name.split()[1] for name in COMMANDS}
    assert {"dlq", "trace", "retention", "metrics", "queues", "doctor", "status"} <= groups
    assert {"outbox", "schedule"} <= groups
    assert "conventions dlq replay" in COMMANDS


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_cli_command_has_its_section_in_the_cli_reference(command: str) -> None:
    sections = cli_sections()
    assert command in sections, (
        f"docs/reference/cli.md has no section for {command!r}: add a heading "
        f"'### `{command}`' with its synopsis, options, exit status and an example"
    )


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_of_a_command_is_documented_in_its_section(command: str) -> None:
    section = cli_sections().get(command, "")
    missing = [arg for arg in own_arguments(COMMANDS[command]) if not mentions(section, arg)]
    assert not missing, f"docs/reference/cli.md, section {command!r}: document {missing}"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_section_states_its_exit_status(command: str) -> None:
    assert "exit status" in cli_sections().get(command, "").lower(), (
        f"docs/reference/cli.md, section {command!r}: say what its exit status means"
    )


def test_the_cli_reference_documents_no_command_that_does_not_exist() -> None:
    stale = sorted(set(cli_sections()) - set(COMMANDS))
    assert not stale, f"docs/reference/cli.md documents commands the CLI lacks: {stale}"


def test_the_global_options_are_in_the_cli_reference() -> None:
    text = CLI_PAGE.read_text()
    documented = ("-A", "CONVENTIONS_APP", "CONVENTIONS_TIMEOUT", *own_arguments(cli))
    missing = [option for option in documented if not mentions(text, option)]
    assert not missing, f"docs/reference/cli.md: document the global options {missing}"


# -- settings and environment variables -------------------------------------------------------
def string_calls(tree: ast.AST, method: str) -> Iterator[tuple[ast.Call, str]]:
    """``X.<method>("literal", ...)`` calls and their first argument."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == method
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node, node.args[0].value


def settings_read_by_the_layer() -> set[str]:
    """Every ``conventions_*`` name the layer reads: any ``conf.get("conventions_...")``
    in ``conventions/``, and every ``conventions_*`` literal ``settings.py`` passes on."""
    names: set[str] = set()
    for path in (ROOT / "conventions").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names |= {value for _, value in string_calls(tree, "get")}
        if path.name == "settings.py":
            names |= {
                node.value
                for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and isinstance(node.value, str)
            }
    return {n for n in names if re.fullmatch(r"conventions_[a-z_]+", n)}


def environment_read_by_celeryconfig() -> set[str]:
    """Every variable ``celeryconfig.py`` reads: ``_env.get("X")``, ``_env["X"]``,
    ``os.environ.get("X")``, ``os.getenv("X")``."""
    tree = ast.parse((ROOT / "celeryconfig.py").read_text())
    names = {
        value
        for call, value in string_calls(tree, "get")
        if isinstance(call.func, ast.Attribute) and ast.unparse(call.func.value) in ENVIRONS
    }
    names |= {value for _, value in string_calls(tree, "getenv")}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Subscript)
            and ast.unparse(node.value) in ENVIRONS
            and isinstance(node.slice, ast.Constant)
        ):
            names.add(str(node.slice.value))
    return names


ENVIRONS = ("_env", "os.environ")


def test_the_source_scan_finds_the_known_settings_and_variables() -> None:
    settings = settings_read_by_the_layer()
    assert {"conventions_lease_seconds", "conventions_outbox_url", "conventions_limits"} <= settings
    assert "conventions_doctor_on_start" in settings  # read outside settings.py
    variables = environment_read_by_celeryconfig()
    assert {"REDIS_URL", "CONVENTIONS_UNACKED_MUTEX_EXPIRE", "SENTRY_DSN"} <= variables


def test_every_conventions_setting_the_layer_reads_is_in_the_settings_reference() -> None:
    text = SETTINGS_PAGE.read_text()
    missing = sorted(s for s in settings_read_by_the_layer() if f"`{s}`" not in text)
    assert not missing, f"docs/reference/settings.md: add a row for {missing}"


def test_every_conventions_setting_celeryconfig_sets_is_in_the_settings_reference() -> None:
    tree = ast.parse((ROOT / "celeryconfig.py").read_text())
    assigned = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name) and target.id.startswith("conventions_")
    }
    text = SETTINGS_PAGE.read_text()
    missing = sorted(s for s in assigned if f"`{s}`" not in text)
    assert assigned and not missing, f"docs/reference/settings.md: add a row for {missing}"


def test_every_environment_variable_celeryconfig_reads_is_in_the_settings_reference() -> None:
    text = SETTINGS_PAGE.read_text()
    missing = sorted(v for v in environment_read_by_celeryconfig() if f"`{v}`" not in text)
    assert not missing, f"docs/reference/settings.md, environment variables: add {missing}"


# -- the module table of the architecture page ----------------------------------------------
def test_every_module_of_conventions_is_in_the_architecture_module_table() -> None:
    text = ARCHITECTURE_PAGE.read_text()
    table = text[text.index("## Modules") : text.index("\n## ", text.index("## Modules") + 1)]
    package = ROOT / "conventions"
    named = set(re.findall(r"`([a-z_/]+)`", table))
    modules = set()
    for path in package.rglob("*.py"):
        parts = path.relative_to(package).with_suffix("").parts
        if "migrations" in parts or parts == ("__init__",):
            continue
        if parts[-1] == "__init__":  # a subpackage: its own heading row, or one for the app
            modules.add(f"{'/'.join(parts[:-1])}/")
        else:
            modules.add("/".join(parts))
    # a module of a package the table names as a whole (``contrib/django_outbox/``)
    whole = {n for n in named if n.endswith("/") and n.count("/") > 1}
    missing = sorted(
        m for m in modules if m not in named and not any(m.startswith(w) for w in whole)
    )
    stale = sorted(
        n for n in named
        if "/" in n and n not in modules and not (package / f"{n}.py").exists()
    )  # fmt: skip
    assert not missing, f"docs/discussions/architecture.md, ## Modules: add {missing}"
    assert not stale, f"docs/discussions/architecture.md, ## Modules: no such module {stale}"
