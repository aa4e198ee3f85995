"""The reliable profile: one call holds every setting the promises rest on, an override
that breaks one is refused, and the doctor checks the same list."""

from __future__ import annotations

from typing import Any

import pytest
from kombu.utils.imports import symbol_by_name

from conventions import App, ConfigurationError
from conventions.config import profile
from conventions.config.profile import (
    INBOX_TRANSPORT,
    PUBLISH_TIMEOUT,
    RECOVERY_TIMEOUT,
    promises,
    reliable,
)
from conventions.jobs import routing
from conventions.ops.doctor import profile_findings, static_checks
from conventions.store.redis import SOCKET_TIMEOUT, RedisStore
from conventions.transport.redis import Transport

REDIS = "redis://localhost:6379/0"


def _profile(**overrides: Any) -> dict[str, Any]:
    return reliable(broker_url=REDIS, store_url=REDIS, **overrides)


def test_the_profile_holds_the_whole_reliable_configuration() -> None:
    conf = _profile()
    assert conf["task_acks_late"] is conf["task_reject_on_worker_lost"] is True
    assert conf["worker_prefetch_multiplier"] == 1
    assert conf["broker_transport"] == INBOX_TRANSPORT
    assert conf["result_backend"] == f"conventions.results.redis:RedisBackend+{REDIS}"
    assert conf["result_backend_always_retry"] is True
    assert conf["worker_send_task_events"] is conf["task_send_sent_event"] is True
    assert conf["worker_soft_shutdown_timeout"] > 0
    assert conf["task_serializer"] == "json" and conf["accept_content"] == ["json"]
    assert conf["broker_transport_options"]["socket_timeout"] == PUBLISH_TIMEOUT
    options = conf["broker_transport_options"]
    # a live worker renews its jobs: the transport's visibility timeout is the recovery
    # bound, none is set for another transport (kombu's default, 3600 s, applies there)
    assert options["recovery_timeout"] == RECOVERY_TIMEOUT
    assert "visibility_timeout" not in options
    assert options["unacked_mutex_expire"] <= RECOVERY_TIMEOUT / 3
    assert conf["conventions_store_url"] == REDIS
    # and it keeps every promise it lists
    assert all(p.kept_by(p.found(conf)) for p in promises(conf))


def test_an_app_with_the_profile_and_its_routing_has_no_doctor_finding() -> None:
    workloads = {"email": "email", "heavy": "heavy"}
    app = App("profile_sound", set_as_current=False)
    app.conf.update(
        _profile(), conventions_workloads=workloads, task_queues=routing.queues_for(workloads),
        task_routes=(routing.WorkloadRouter(workloads),), task_default_queue="email",
    )  # fmt: skip
    assert static_checks(app, server=False) == []


def test_the_profile_names_the_transport_it_cannot_import() -> None:
    assert symbol_by_name(profile.INBOX_TRANSPORT) is Transport


def test_the_reference_config_applies_the_profile_and_keeps_every_promise() -> None:
    import celeryconfig

    conf = {k: v for k, v in vars(celeryconfig).items() if not k.startswith("_")}
    assert list(profile_findings(conf)) == []
    options = conf["broker_transport_options"]
    assert options["recovery_timeout"] == celeryconfig.RECOVERY_TIMEOUT == 30
    assert "renew_unacked" not in options  # on: the heavy lane's 30-minute jobs are renewed
    assert conf["conventions_workloads"] == celeryconfig.WORKLOADS


def test_the_adopt_example_applies_the_profile() -> None:
    from examples.howto import adopt

    assert adopt.app.conf.task_acks_late is True
    assert adopt.app.conf.broker_transport == INBOX_TRANSPORT
    assert list(profile_findings(adopt.app.conf)) == []


def test_a_setting_the_profile_does_not_have_is_refused_with_the_nearest_name() -> None:
    with pytest.raises(ConfigurationError) as refused:
        _profile(task_ack_late=True)
    message = str(refused.value)
    assert "'task_ack_late' is not a setting of the profile" in message
    assert "did you mean 'task_acks_late'" in message and "\n" not in message
    assert _profile(allow={"beat_scheduler"}, beat_scheduler="x:Y")["beat_scheduler"] == "x:Y"


@pytest.mark.parametrize(
    ("override", "name"),
    [
        ({"task_acks_late": False}, "task_acks_late"),
        ({"worker_prefetch_multiplier": 4}, "worker_prefetch_multiplier"),
        ({"accept_content": ["json", "pickle"]}, "accept_content"),
        ({"broker_transport": None}, "broker_transport"),
        ({"broker_transport_options": {"socket_timeout": None}}, "socket_timeout"),
        ({"task_publish_retry_policy": {"interval_max": 1}}, "task_publish_retry_policy"),
    ],
)
def test_an_override_that_breaks_a_promise_is_refused_unless_allowed(
    override: dict[str, Any], name: str
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        _profile(**override)
    message = str(refused.value)
    assert name in message and "breaks a promise" in message and "\n" not in message
    ((key, value),) = override.items()
    allowed = _profile(allow={key}, **override)  # taken on purpose: accepted as given
    assert allowed[key] == value or allowed[key] == {**_profile()[key], **value}


def test_a_default_is_overridden_freely_and_transport_options_are_merged() -> None:
    conf = _profile(worker_soft_shutdown_timeout=30.0, broker_transport_options={"x": 1})
    assert conf["worker_soft_shutdown_timeout"] == 30.0
    assert conf["broker_transport_options"]["x"] == 1
    assert conf["broker_transport_options"]["socket_timeout"] == PUBLISH_TIMEOUT


def test_a_time_limit_beyond_the_visibility_timeout_is_refused_without_renewal_unless_allowed(
) -> None:  # fmt: skip
    norenew = {"broker_transport_options": {"renew_unacked": False}}
    with pytest.raises(ConfigurationError, match="beyond the visibility timeout"):
        _profile(visibility_timeout=60, **norenew)
    conf = _profile(visibility_timeout=60, allow={"visibility_timeout"}, **norenew)
    assert conf["task_time_limit"] == 300
    # kombu's own transport has no renewal: its visibility timeout is the old clock
    kombus = _profile(broker_transport="redis", allow={"broker_transport"})
    assert "visibility_timeout" not in kombus["broker_transport_options"]
    # the layer's transport renews: a time limit far beyond the recovery bound is fine
    assert _profile(task_time_limit=1800, task_soft_time_limit=1700)["task_time_limit"] == 1800
    with pytest.raises(ConfigurationError, match="soft limit must come first"):
        _profile(task_soft_time_limit=300)


def test_the_publish_timeout_bounds_every_part_of_the_publish() -> None:
    conf = _profile(publish_timeout=2)
    assert conf["conventions_publish_timeout"] == 2
    assert conf["broker_connection_timeout"] == conf["redis_socket_timeout"] == 2
    options = conf["broker_transport_options"]
    assert options["socket_timeout"] == options["socket_connect_timeout"] == 2
    assert conf["result_backend_transport_options"]["retry_policy"]["max_retries"] == 0
    assert conf["task_publish_retry_policy"]["max_retries"] == 1


def test_another_broker_gets_no_redis_transport_and_no_result_backend_of_its_own() -> None:
    conf = reliable(broker_url="amqp://guest@localhost//", store_url=REDIS)
    assert "broker_transport" not in conf and "result_backend" not in conf
    assert conf["broker_transport_options"] == {"confirm_publish": True}
    assert {p.key for p in promises(conf)}.isdisjoint({"broker_transport", "redis_socket_timeout"})


def test_the_doctor_reports_each_deviation_with_the_key_the_value_found_and_the_profiles() -> None:
    conf = _profile()
    conf.update(task_acks_late=False, worker_prefetch_multiplier=4)
    conf["broker_transport_options"] = {"visibility_timeout": 3600}
    found = {f.subject: f for f in profile_findings(conf)}
    assert set(found) == {
        "task_acks_late",
        "worker_prefetch_multiplier",
        "broker_transport_options['socket_timeout']",
        "broker_transport_options['socket_connect_timeout']",
    }
    assert found["task_acks_late"].message.startswith("False, the profile's value is True")
    assert found["worker_prefetch_multiplier"].code == "profile-deviation"
    assert found["broker_transport_options['socket_timeout']"].code == "publish-unbounded"
    assert (
        "None, the profile's value is 5.0"
        in found["broker_transport_options['socket_timeout']"].message
    )


def test_the_store_waits_as_long_as_the_profile_at_most() -> None:
    assert SOCKET_TIMEOUT == profile.PUBLISH_TIMEOUT
    store = RedisStore("redis://127.0.0.1:1/0")  # nothing listens there: nothing connects
    options = store.client.get_connection_kwargs()
    assert options["socket_timeout"] == options["socket_connect_timeout"] == SOCKET_TIMEOUT
    store.close()


def test_an_idle_cold_shutdown_waits_only_where_a_worker_may_hold_a_message_not_yet_due() -> None:
    # the layer's Redis transport keeps delayed messages in Redis, RabbitMQ puts a held
    # one back on close: an idle worker's SIGQUIT need not wait the soft timeout
    assert _profile()["worker_enable_soft_shutdown_on_idle"] is False
    amqp = reliable(broker_url="amqp://guest@localhost//", store_url=REDIS)
    assert amqp["worker_enable_soft_shutdown_on_idle"] is False
    # a broker of kombu's own (here its filesystem transport) may hold them: it waits
    other = reliable(broker_url="filesystem://", store_url=REDIS)
    assert other["worker_enable_soft_shutdown_on_idle"] is True
    assert other["worker_soft_shutdown_timeout"] > 0
