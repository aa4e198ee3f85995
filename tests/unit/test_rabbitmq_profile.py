"""The reliable profile on RabbitMQ, without a broker: the settings it adds, the queues an
App builds from them, the delay bound, the poison record's reading of ``x-death``, and
the doctor's RabbitMQ checks."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import amqp
import pytest
from kombu import Exchange, Queue

from conventions import App, Backoff, JobContext, Payload
from conventions.config import settings
from conventions.config.profile import promises, reliable
from conventions.errors import ConfigurationError, LayerError, Unroutable
from conventions.jobs.routing import WorkloadRouter, queues_for
from conventions.ops import doctor_rabbitmq
from conventions.ops.doctor import ERROR, WARNING, static_checks
from conventions.transport import amqp_queues
from conventions.worker import poison_queue

AMQP = "amqp://guest:guest@127.0.0.1:5672//"
REDIS = "redis://127.0.0.1:6379/0"
_NUMBERS = itertools.count(1)
ARGUMENTS = {
    "x-queue-type": "quorum",
    "x-delivery-limit": 5,
    "x-dead-letter-exchange": "conventions.poison",
    "x-dead-letter-strategy": "at-least-once",
    "x-overflow": "reject-publish",
}


def _app(**conf: Any) -> App:
    app = App(f"q26_unit_{next(_NUMBERS)}", set_as_current=False)
    app.conf.update(reliable(broker_url=AMQP, store_url=REDIS), **conf)
    return app


class Ids(Payload):
    order_id: str


def _job(app: App, **options: Any) -> str:
    name = f"q26.unit_{next(_NUMBERS)}.v1"

    def body(payload: Ids, ctx: JobContext) -> None: ...

    app.job(name, payload=Ids, key="q26:{order_id}", workload="email", **options)(body)
    return name


# -- the profile -------------------------------------------------------------------------


def test_on_amqp_the_profile_adds_confirms_and_quorum_queues_and_nothing_of_redis() -> None:
    conf = reliable(broker_url=AMQP, store_url=REDIS)
    assert conf["broker_transport_options"] == {"confirm_publish": True}
    assert conf["conventions_quorum_queues"] is True
    assert conf["worker_detect_quorum_queues"] is True
    assert "broker_transport" not in conf
    keys = {p.name for p in promises(conf)}
    assert "broker_transport_options['confirm_publish']" in keys
    assert "worker_detect_quorum_queues" in keys


def test_on_redis_nothing_of_rabbitmq_is_added() -> None:
    conf = reliable(broker_url=REDIS, store_url=REDIS)
    assert "conventions_quorum_queues" not in conf and "confirm_publish" not in str(conf)
    assert not settings.quorum_queues(conf)
    with pytest.raises(ConfigurationError, match="not a setting of the profile"):
        reliable(broker_url=REDIS, store_url=REDIS, conventions_quorum_queues=True)


def test_turning_confirms_off_breaks_a_promise_unless_allowed() -> None:
    off = {"broker_transport_options": {"confirm_publish": False}}
    with pytest.raises(ConfigurationError, match="publisher confirms"):
        reliable(broker_url=AMQP, store_url=REDIS, **off)
    conf = reliable(broker_url=AMQP, store_url=REDIS, allow={"broker_transport_options"}, **off)
    assert conf["broker_transport_options"]["confirm_publish"] is False


def test_classic_queues_are_a_default_one_may_turn_off() -> None:
    conf = reliable(broker_url=AMQP, store_url=REDIS, conventions_quorum_queues=False)
    assert not settings.quorum_queues(conf)


# -- the queues --------------------------------------------------------------------------


def test_the_app_builds_quorum_queues_on_topic_exchanges_with_the_one_set_of_arguments() -> None:
    app = _app(conventions_workloads={"email": "q26_email", "heavy": "q26_heavy"},
               task_default_queue="q26_default")  # fmt: skip
    queues = {q.name: q for q in app.amqp.queues.values()}
    assert set(queues) == {"q26_email", "q26_heavy", "q26_default"}
    for name, queue in queues.items():
        assert queue.queue_arguments == ARGUMENTS
        assert (queue.exchange.name, queue.exchange.type, queue.routing_key) == (
            name, "topic", name,
        )  # fmt: skip
    assert amqp_queues.queue_arguments(app.conf) == ARGUMENTS  # what a publisher declares
    assert settings.delayed_delivery(app.conf) and settings.native_delays(app.conf)


def test_the_delivery_limit_follows_the_layers_poison_detection_unless_set() -> None:
    assert settings.delivery_limit({}) == settings.DEFAULT_MAX_DELIVERIES + 2 == 5
    assert settings.delivery_limit({"conventions_max_deliveries": 10}) == 12
    assert settings.delivery_limit({"conventions_delivery_limit": 7}) == 7
    app = _app(conventions_poison_queue="q26_dead", conventions_delivery_limit=9,
               conventions_workloads={"email": "q26_email"})  # fmt: skip
    (queue, *_) = app.amqp.queues.values()
    assert queue.queue_arguments["x-delivery-limit"] == 9
    assert queue.queue_arguments["x-dead-letter-exchange"] == "q26_dead"
    poison = amqp_queues.poison_queue(app.conf)
    assert (poison.name, poison.exchange.type) == ("q26_dead", "fanout")
    assert poison.queue_arguments == {"x-queue-type": "quorum"}


def test_classic_queues_stay_when_the_flag_is_off_or_the_app_declares_its_own() -> None:
    off = _app(conventions_quorum_queues=False, conventions_workloads={"email": "q26_e"})
    assert all(not q.queue_arguments for q in off.amqp.queues.values())
    assert not settings.delayed_delivery(off.conf)
    assert settings.max_countdown(off.conf) == settings.DEFAULT_MAX_COUNTDOWN
    own = _app(task_queues=queues_for({"email": "q26_e"}))
    assert not settings.quorum_queues(own.conf)


def test_the_broker_keeps_delays_on_quorum_queues_so_the_countdown_bound_is_a_year() -> None:
    app = _app(conventions_workloads={"email": "q26_email"})
    assert app.amqp.queues  # built
    assert settings.max_countdown(app.conf) == settings.DELAYED_SET_MAX_COUNTDOWN
    direct = _app(task_queues=queues_for({"email": "q26_e"}, arguments=lambda _n: ARGUMENTS))
    assert settings.quorum_queues(direct.conf) and not settings.native_delays(direct.conf)
    assert settings.max_countdown(direct.conf) == settings.DEFAULT_MAX_COUNTDOWN


def test_a_delay_under_a_second_becomes_one_second_never_less() -> None:
    options: dict[str, Any] = {"countdown": 0.3}
    amqp_queues.whole_second_delay(options)
    assert options == {"countdown": 1.0}
    options = {"countdown": 2.5}
    amqp_queues.whole_second_delay(options)
    assert options == {"countdown": 2.5}
    soon = {"eta": datetime.now(UTC) + timedelta(milliseconds=400)}
    amqp_queues.whole_second_delay(soon)
    assert soon == {"countdown": 1.0}
    later = {"eta": datetime.now(UTC) + timedelta(seconds=30)}
    amqp_queues.whole_second_delay(later)
    assert "eta" in later and "countdown" not in later


# -- unroutable --------------------------------------------------------------------------


def test_a_returned_or_exchangeless_publish_is_unroutable_a_layer_error() -> None:
    returned = amqp.exceptions.ChannelError("Basic.return", reply_code=312)
    found = amqp_queues.unroutable(returned, "shop.x.v1")
    assert isinstance(found, Unroutable) and isinstance(found, LayerError)
    assert "shop.x.v1" in str(found) and "\n" not in str(found)
    missing = amqp.exceptions.NotFound("NOT_FOUND - no exchange 'x' in vhost '/'")
    assert isinstance(amqp_queues.unroutable(missing, "t"), Unroutable)
    assert amqp_queues.unroutable(RuntimeError("wrapped"), "t") is None
    wrapped = RuntimeError("publish failed")
    wrapped.__cause__ = missing
    assert isinstance(amqp_queues.unroutable(wrapped, "t"), Unroutable)
    assert amqp_queues.unroutable(ConnectionRefusedError(), "t") is None


# -- the poison record -------------------------------------------------------------------


def _headers(**extra: Any) -> dict[str, Any]:
    at = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    return {
        "id": "job-1",
        "task": "shop.x.v1",
        "x-death": [
            {"queue": "celery_delayed_0", "reason": "expired", "count": 1, "time": at},
            {"queue": "email", "reason": "delivery_limit", "count": 1, "time": at,
             "exchange": "email", "routing-keys": ["email"]},
        ],
        **extra,
    }  # fmt: skip


def test_the_reason_reads_the_death_in_the_workload_queue_not_the_delay_queues() -> None:
    headers = _headers()
    assert poison_queue.last_death(headers)["queue"] == "email"
    reason = poison_queue.reason_of(headers, 5)
    assert "from queue 'email'" in reason and "delivery_limit" in reason
    assert "x-delivery-limit 5: delivered 6 times" in reason


def test_one_dead_lettered_message_has_one_record_id_across_deliveries() -> None:
    assert poison_queue.record_id(_headers()) == poison_queue.record_id(_headers())
    assert poison_queue.record_id(_headers()) != poison_queue.record_id(_headers(id="job-2"))


def test_a_message_its_worker_rejected_is_dropped_not_recorded_twice() -> None:
    rejected = {"id": "j", "x-death": [{"queue": "email", "reason": "rejected", "count": 1}]}
    message = SimpleNamespace(headers=rejected)
    assert poison_queue.handle(SimpleNamespace(), message, "w") is True  # no store touched


# -- the doctor --------------------------------------------------------------------------


def _findings(app: App) -> set[tuple[str, str, str]]:
    return {(f.level, f.code, f.subject) for f in static_checks(app, server=False)}


def test_the_profiles_quorum_queues_have_no_rabbitmq_finding() -> None:
    app = _app(conventions_workloads={"email": "q26_email"}, task_default_queue="q26_email")
    _job(app, time_limit=1500, backoff=Backoff(cap=3600))
    codes = {code for _, code, _ in _findings(app)}
    assert codes.isdisjoint(
        {"classic-queue", "direct-exchange-delays", "poison-queue-missing",
         "delivery-limit-below-claims", "rabbitmq-consumer-timeout", "publish-unconfirmed"}
    )  # fmt: skip  # a retry's wait is the broker's: no consumer_timeout to reach


def test_classic_direct_and_foreign_dead_lettering_are_each_said() -> None:
    mixed = (
        Queue("q26_classic", Exchange("q26_classic", type="direct"), routing_key="q26_classic"),
        Queue("q26_direct", Exchange("q26_direct", type="direct"), routing_key="q26_direct",
              queue_arguments=ARGUMENTS),
        Queue("q26_foreign", Exchange("q26_foreign", type="topic"), routing_key="q26_foreign",
              queue_arguments={"x-queue-type": "quorum", "x-dead-letter-exchange": "elsewhere"}),
    )  # fmt: skip
    app = _app(task_queues=mixed, task_default_queue="q26_classic",
               task_routes=(WorkloadRouter({"email": "q26_classic"}),))  # fmt: skip
    found = _findings(app)
    assert (WARNING, "classic-queue", "q26_classic") in found
    assert (WARNING, "direct-exchange-delays", "q26_direct") in found
    assert (ERROR, "poison-queue-missing", "q26_foreign") in found
    assert not {f for f in found if f[2] == "q26_direct" and f[1] != "direct-exchange-delays"}


def test_a_delivery_limit_at_or_below_the_claims_is_a_warning() -> None:
    app = _app(conventions_workloads={"email": "q26_email"}, conventions_delivery_limit=3)
    assert (WARNING, "delivery-limit-below-claims", "conventions_delivery_limit") in _findings(app)


def test_confirms_off_is_a_profile_deviation_on_amqp() -> None:
    app = _app(conventions_workloads={"email": "q26_email"})
    app.conf.broker_transport_options = {}
    subject = "broker_transport_options['confirm_publish']"
    assert (WARNING, "publish-unconfirmed", subject) in _findings(app)


def test_the_live_checks_say_a_routed_queue_and_the_poison_queue_nobody_consumes() -> None:
    conf = reliable(broker_url=AMQP, store_url=REDIS)
    found = {
        (f.level, f.code, f.subject)
        for f in doctor_rabbitmq.live_findings(
            conf,
            consumers={"email": 0, "heavy": 0, "busy": 2, "conventions.poison": 0},
            backlog={"email": 4},
            routed={"email", "heavy", "busy", "missing"},
        )
    }
    assert found == {
        (ERROR, "rabbitmq-no-consumer", "email"),  # jobs wait
        (WARNING, "rabbitmq-no-consumer", "heavy"),  # empty for now
        (WARNING, "poison-queue-unconsumed", "conventions.poison"),
    }


def test_an_expired_message_is_said_expired_not_a_crash() -> None:
    expired = {"id": "j", "x-death": [{"queue": "email", "reason": "expired", "count": 1}]}
    reason = poison_queue.reason_of(expired, 5)
    assert "expired" in reason and "delivered" not in reason
