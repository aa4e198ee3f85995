"""Priority levels of jobs: three names, one number per broker.

A job or a workload declares a **level**, never a number: ``high``, ``normal`` or
``low``. The brokers count priorities in opposite directions (on Redis kombu's step 0 is
the highest; on RabbitMQ the largest number is), so a number written in code means the
opposite on the other broker. The level becomes the message's priority when the job is
published (``ConventionTask.with_level``, and the router for Celery's own paths:
:class:`conventions.jobs.routing.WorkloadRouter`), in whatever process publishes: the
job's own level (``@app.job(..., priority="low")``), else its workload's
(``conventions_workload_priorities = {"light": "high"}``), else none (the message keeps
Celery's ``task_default_priority``, which a level wins over). A call's own ``priority=``
number still wins.

On Redis the levels are kombu's priority steps 0, 3 and 6, fetched in a weighted order
so that a flood of ``high`` cannot starve ``low`` (:mod:`conventions.transport.priorities`);
``priority_steps`` must be ``[0, 3, 6]`` for them to be apart. On RabbitMQ they are 9, 4
and 0: quorum queues before 4.0 ignore priorities, and 4.0 to 4.2 keep two (5 and up is
their high, delivered 2:1 against the rest), so ``normal`` and ``low`` share one there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conventions.config import profile
from conventions.errors import ConfigurationError

#: the levels, highest first
LEVELS = ("high", "normal", "low")
#: level -> kombu's priority step on Redis (0 is the highest)
REDIS_STEPS: Mapping[str, int] = {"high": 0, "normal": 3, "low": 6}
#: the ``priority_steps`` that keep the three levels apart on Redis
STEPS = [0, 3, 6]
#: kombu's step -> its level, with :data:`STEPS`
STEP_NAMES: Mapping[int, str] = {step: level for level, step in REDIS_STEPS.items()}
#: level -> the message priority on RabbitMQ (the largest is the highest)
AMQP_PRIORITIES: Mapping[str, int] = {"high": 9, "normal": 4, "low": 0}


#: why a job declared from a Contract takes no ``priority=``
NOT_IN_CONTRACT = (
    "a priority changes what a publish does, and the publisher has only the Contract: "
    "give the workload its level (conventions_workload_priorities), which both read"
)


def check_level(owner: str, level: Any, conf: Any = None) -> str | None:
    """``level`` if it is one of :data:`LEVELS` (or None); else the error that says so.
    With ``conf``, its workloads' levels are checked too (at each job's definition)."""
    if conf is not None:
        workload_levels(conf)
    if level is None or level in LEVELS:
        return None if level is None else str(level)
    raise ConfigurationError(
        f"{owner}: priority must be one of {', '.join(LEVELS)} (a level, not a number: "
        f"the brokers count priorities in opposite directions), got {level!r}"
    )


def workload_levels(conf: Any) -> dict[str, str]:
    """``conventions_workload_priorities``: workload -> level, each level checked."""
    value = conf.get("conventions_workload_priorities") if hasattr(conf, "get") else None
    levels = dict(value or {})
    for workload, level in levels.items():
        check_level(f"conventions_workload_priorities[{workload!r}]", level)
    return levels


def level_of(task: Any, workload: str) -> str | None:
    """The level a job's messages carry: its own, else its workload's, else None."""
    own = getattr(task, "priority_level", None)
    if own is not None:
        return str(own)
    app = getattr(task, "app", None)
    return workload_levels(app.conf).get(workload) if app is not None else None


def message_priority(conf: Any, level: str) -> int:
    """The message priority of ``level`` on the app's broker."""
    url = conf.get("broker_url") if hasattr(conf, "get") else None
    return (AMQP_PRIORITIES if profile.is_amqp(url) else REDIS_STEPS)[level]
