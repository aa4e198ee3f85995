"""docker/compose.yaml and docker/Dockerfile, checked without a Docker engine."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures import missing_tool

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
#: Celery's soft shutdown window after the layer's grace (``worker_soft_shutdown_timeout``)
SOFT_SHUTDOWN_S = 10
FLOWER_CREDENTIALS = {"FLOWER_USER": "admin", "FLOWER_PASSWORD": "secret"}


def load_compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def services() -> dict[str, dict[str, Any]]:
    found = load_compose()["services"]
    assert isinstance(found, dict)
    return found


def argv(command: str | list[str]) -> list[str]:
    """A service's command as the argument list the container runs."""
    return shlex.split(command) if isinstance(command, str) else [str(arg) for arg in command]


def option(args: list[str], name: str) -> str | None:
    """The value of ``name`` in ``args`` (``-Q email`` or ``--queues=email``)."""
    for index, arg in enumerate(args):
        if arg == name and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    return None


def seconds(duration: str | int) -> float:
    """A compose duration (``35m``, ``1h30m``, ``90s``, ``500ms``) in seconds."""
    if isinstance(duration, int):
        return float(duration)
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    assert parts, f"not a duration: {duration!r}"
    assert "".join(number + unit for number, unit in parts) == duration
    return sum(float(number) * units[unit] for number, unit in parts)


def depends_on(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    value = service.get("depends_on") or {}
    if isinstance(value, list):
        return {name: {"condition": "service_started"} for name in value}
    assert isinstance(value, dict)
    return value


def one_shot_services() -> set[str]:
    """Services that run to completion and that others wait for by exit code."""
    all_services = services()
    awaited = {
        target
        for service in all_services.values()
        for target, rule in depends_on(service).items()
        if rule.get("condition") == "service_completed_successfully"
    }
    return {name for name in awaited if all_services[name].get("restart") == "no"}


def worker_services() -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in services().items()
        if argv(service.get("command", []))[:4] == ["celery", "-A", "tasks", "worker"]
    }


# -- compose.yaml --------------------------------------------------------------------------


def test_compose_defines_the_expected_services() -> None:
    assert {
        "redis",
        "postgres",
        "worker-email",
        "worker-heavy",
        "beat",
        "flower",
    } <= set(services())


def test_every_long_running_service_has_an_enabled_healthcheck() -> None:
    one_shots = one_shot_services()
    for name, service in services().items():
        healthcheck = service.get("healthcheck")
        assert healthcheck, f"{name} has no healthcheck"
        if name in one_shots:
            continue
        assert not healthcheck.get("disable"), f"{name} disables its healthcheck"
        assert healthcheck.get("test"), f"{name}'s healthcheck has no test"


def test_only_one_shot_services_disable_their_healthcheck() -> None:
    disabled = {
        name
        for name, service in services().items()
        if (service.get("healthcheck") or {}).get("disable")
    }
    assert disabled <= one_shot_services()


def test_beat_answers_remote_control_pings() -> None:
    args = argv(services()["beat"]["command"])
    assert args[:4] == ["celery", "-A", "tasks", "beat"]
    assert "--enable-remote-control" in args


def test_workers_stop_grace_period_outlasts_the_shutdown_grace_and_the_soft_shutdown() -> None:
    workers = worker_services()
    assert {"worker-email", "worker-heavy"} <= set(workers)
    for name, service in workers.items():
        assert "stop_grace_period" in service, f"{name} has no stop_grace_period"
        grace = float(service["environment"]["CONVENTIONS_SHUTDOWN_GRACE"])
        assert seconds(service["stop_grace_period"]) > grace + SOFT_SHUTDOWN_S, name


def test_each_worker_lane_gives_its_jobs_their_whole_time_limit_after_sigterm() -> None:
    import celeryconfig

    for name, service in worker_services().items():
        lane = name.removeprefix("worker-")
        limit = celeryconfig.WORKLOAD_TIME_LIMITS[lane]
        assert float(service["environment"]["CONVENTIONS_SHUTDOWN_GRACE"]) >= limit, name
        assert seconds(service["stop_grace_period"]) > limit, name


def test_redis_keeps_an_append_only_file_and_never_evicts() -> None:
    command = " ".join(argv(services()["redis"]["command"]))
    assert "--appendonly yes" in command
    assert "--maxmemory-policy noeviction" in command
    assert services()["redis"].get("volumes"), "the AOF needs a volume to survive"


def test_email_worker_consumes_only_the_email_queue() -> None:
    args = argv(services()["worker-email"]["command"])
    assert option(args, "-Q") == "email"
    assert option(args, "-n") == "email@%h"


def test_heavy_worker_consumes_only_the_heavy_queue_one_job_at_a_time() -> None:
    args = argv(services()["worker-heavy"]["command"])
    assert option(args, "-Q") == "heavy"
    assert option(args, "--prefetch-multiplier") == "1"
    assert option(args, "-c") == "1"
    assert option(args, "-O") == "fair"


def test_worker_and_beat_healthchecks_ping_their_own_node() -> None:
    pinged = {**worker_services(), "beat": services()["beat"]}
    for name, service in pinged.items():
        node = option(argv(service["command"]), "-n")
        assert node is not None, f"{name} has no node name"
        test = " ".join(argv(service["healthcheck"]["test"]))
        assert "inspect ping" in test, name
        prefix = node.split("@", 1)[0]
        assert f"-d {prefix}@$${{HOSTNAME}}" in test, name


def test_every_depends_on_target_exists_and_waits_for_health_or_completion() -> None:
    all_services = services()
    one_shots = one_shot_services()
    for name, service in all_services.items():
        for target, rule in depends_on(service).items():
            assert target in all_services, f"{name} depends on unknown {target}"
            expected = (
                "service_completed_successfully" if target in one_shots else "service_healthy"
            )
            assert rule.get("condition") == expected, f"{name} -> {target}"


def test_app_services_get_redis_database_and_store_urls() -> None:
    expected = {
        "REDIS_URL": "redis://redis:6379/0",
        "DATABASE_URL": "postgresql+psycopg://shop:shop@postgres:5432/shop",
        "CONVENTIONS_STORE_URL": "redis://redis:6379/1",
    }
    for name in ("worker-email", "worker-heavy", "beat", "flower"):
        environment = services()[name]["environment"]
        assert isinstance(environment, dict)
        for key, value in expected.items():
            assert environment.get(key) == value, f"{name}: {key}"


def test_flower_is_behind_basic_auth() -> None:
    flower = services()["flower"]
    command = " ".join(argv(flower["command"]))
    auth = flower.get("environment", {}).get("FLOWER_BASIC_AUTH", "")
    assert "--basic-auth" in command or auth
    assert "FLOWER_USER" in (command + auth)
    assert "FLOWER_PASSWORD" in (command + auth)


def test_the_exporter_listens_on_the_compose_network_only_and_publishes_no_host_port() -> None:
    # the exporter binds loopback by default (/metrics has no auth): in its container,
    # Prometheus reaches it only if it binds every interface, which it must say explicitly
    exporter = services()["exporter"]
    args = argv(exporter["command"])
    assert args[:3] == ["conventions", "metrics", "serve"]
    assert option(args, "--addr") == "0.0.0.0"
    assert not exporter.get("ports"), "/metrics has no auth: publish no host port"


# -- Dockerfile --------------------------------------------------------------------------


def test_dockerfile_installs_the_project_and_runs_as_a_non_root_user() -> None:
    text = DOCKERFILE.read_text()
    instructions = [line.strip() for line in text.splitlines() if line.strip()]
    assert "FROM python:3.11-slim" in instructions
    assert any(line.startswith("COPY pyproject.toml") for line in instructions)
    # the layer with the extras the reference app uses (the SQL shop, Sentry, Flower, metrics)
    assert re.search(r"pip install \"\.\[sql,sentry,flower,metrics\]\"", text)
    users = [line.split()[1] for line in instructions if line.startswith("USER ")]
    assert users, "no USER instruction"
    assert users[-1] not in ("root", "0")
    assert (
        'CMD ["celery", "-A", "tasks", "worker", "-Q", "email,heavy", "--loglevel=INFO"]'
        in instructions
    )


# -- docker-compose (Debian's package, no engine needed) -----------------------------------

needs_docker_compose = pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason=missing_tool("docker-compose"),
)


def run_compose_config(extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {
        key: value for key, value in os.environ.items() if not key.startswith("FLOWER_")
    } | extra_env
    return subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config", "-q"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@needs_docker_compose
def test_docker_compose_accepts_the_file() -> None:
    result = run_compose_config(FLOWER_CREDENTIALS)

    assert result.returncode == 0, result.stderr


@needs_docker_compose
def test_docker_compose_refuses_to_start_flower_without_credentials() -> None:
    result = run_compose_config({})

    assert result.returncode != 0
    assert "FLOWER_USER" in result.stderr
