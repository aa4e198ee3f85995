"""Every Redis key the layer writes, in one place.

All keys live under one prefix (``cc:`` by default) so that a deployment can share a
Redis database with other applications, and a test run can use a random prefix and
delete exactly its own keys afterwards (``SCAN MATCH {prefix}*``).

Layout (``{p}`` is the prefix)::

    {p}dedup:{key}              string  job id holding the enqueue reservation (PX ttl)
    {p}print:{key}              string  payload fingerprint of that reservation (same PX)
    {p}ledger:{key}             hash    state=running, owner (PX lease); done: the old layout
    {p}done:{day}               hash    digest of key -> compact done entry (PEXPIREAT day end)
    {p}deliveries:{delivery}    string  claim counter of one delivery (PX delivery_ttl,
                                        dropped when the key is done)
    {p}dl:rec:{id}              hash    data (DeadLetter JSON), indexes (JSON key list)
    {p}dl:all                   zset    id -> last_failed_at (POSIX seconds)
    {p}dl:task:{task}           zset    same, one task
    {p}dl:cat:{category}        zset    same, one category
    {p}dl:cat-task:{cat}:{task} zset    same, one category and one task
    {p}audit:log:{correlation}  list    AuditEvent JSON, append order (EXPIRE audit_ttl)
    {p}audit:by-time            zset    correlation id -> time of its last event
    {p}lease:{name}             string  owner of a named lease (PX ttl)
    {p}state:{name}             string  a small JSON document (PX ttl or none)
    {p}counts                   hash    <name>|<task> -> count (conventions.store.counts)
    {p}bucket:{name}            hash    tat, use, paused: a token bucket (PX until idle)
    {p}batch:{id}               hash    a batch's counters, callbacks' states, spec (JSON)
    {p}batch-m:{id}             hash    member name -> <state>|<task id>|<dead-letter id>
    {p}batches:all              zset    batch id -> created (POSIX seconds)
    {p}batches:due              zset    <batch id>|<callback> -> when it became due

The category comes before the task in ``dl:cat-task:`` because categories never hold a
colon while task names may: the key stays unambiguous.

On Redis Cluster (:func:`scope`) every name above gets a hash tag after the prefix,
``{p}{<tag>}:ledger:{key}``: one of :data:`CLUSTER_PARTITIONS` tags, chosen by the job's
idempotency key (a record's id, a lease's name), so that one job's reservation, ledger
entry, delivery counter, run record and audit events share one slot and one script
moves them. The fleet-wide indexes (``dl:all``, ``audit:by-time``, ``run:all``,
``counts``) exist once per partition and are read by scatter-gather. On one Redis node
the names are exactly the ones above (no tag).

Idempotency keys themselves are namespaced by task here too (:func:`namespaced`): the
store keeps ``payments.apply_event:payment-event:evt_1``, never the bare key a template
renders, so two tasks whose templates render the same string never share a reservation
or a ledger entry. The namespace is the task's name without its version, so v1 and v2
of one job (an upcaster and its target) share their keys. A key is checked where it is
chosen (:func:`checked`): an empty key or one over :data:`MAX_KEY_LENGTH` is refused.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Final

from conventions.errors import PayloadError

#: how many hash-tag partitions a store on Redis Cluster spreads its keys over (fixed: a
#: job's keys are found by its partition, so changing it would lose them). 64 spreads
#: evenly over up to 64 masters and bounds a fleet-wide listing at 64 reads
CLUSTER_PARTITIONS: Final = 64
#: Redis Cluster's slot count
_SLOTS: Final = 16384
#: a trailing ``:<n>`` of a lease name (the slots of one concurrency limit)
_SLOT_NUMBER = re.compile(r":[0-9]+$")

#: the prefix of every key when none is configured
DEFAULT_PREFIX: Final = "cc:"

#: the longest idempotency key accepted, in characters, before the task's namespace: it
#: fits ``once()``'s marker column (``cc_processed_jobs.key``, 255) and the idempotency
#: key field of the common payment providers (Stripe's ``Idempotency-Key``: 255)
MAX_KEY_LENGTH: Final = 255
#: a task name's version suffix (``.v2``), left out of its key namespace
_VERSION = re.compile(r"\.v[0-9]+$")

#: the payload fingerprint an enqueue reservation was taken with (PX as the reservation)
PRINT: Final = "print:"
#: enqueue dedup reservation of an idempotency key (value: the reserving job id)
DEDUP: Final = "dedup:"
#: execution ledger entry of an idempotency key (hash: state, owner, outcome)
LEDGER: Final = "ledger:"
#: the done entries whose keep ends on one day (:mod:`conventions.store.redis_done`)
DONE: Final = "done:"
#: how many times one delivery (a broker message) was claimed: poison detection
DELIVERIES: Final = "deliveries:"

#: one dead-letter record, by id
DEAD_LETTER: Final = "dl:rec:"
#: index of every dead letter by last failure time
DEAD_LETTERS_ALL: Final = "dl:all"
#: index of the dead letters of one task by last failure time
DEAD_LETTERS_BY_TASK: Final = "dl:task:"
#: index of the dead letters of one category by last failure time
DEAD_LETTERS_BY_CATEGORY: Final = "dl:cat:"
#: index of the dead letters of one category and one task by last failure time
DEAD_LETTERS_BY_CATEGORY_TASK: Final = "dl:cat-task:"

#: audit trail of one correlation id (a list, oldest first)
AUDIT: Final = "audit:log:"
#: index of correlation ids by the time of their last event, for purging
AUDIT_BY_TIME: Final = "audit:by-time"

#: a named lease (per-key lock, concurrency slot, schedule overlap)
LEASE: Final = "lease:"
#: a small JSON state document (checkpoint, progress, schedule run)
STATE: Final = "state:"
#: the counters every audit event moves, for the metrics exporter (one hash)
COUNTS: Final = "counts"
#: a token bucket of a dependency rate limit (hash: tat, use, paused)
BUCKET: Final = "bucket:"
#: a batch's counters and callbacks (:mod:`conventions.store.batches`)
BATCH: Final = "batch:"
#: a batch's members and their states
BATCH_MEMBERS: Final = "batch-m:"
#: index of the batches by creation time
BATCHES_ALL: Final = "batches:all"
#: the batch callbacks made due and not yet marked sent (the sweep's list)
BATCHES_DUE: Final = "batches:due"


def dedup(key: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The enqueue reservation key of idempotency key ``key``."""
    return f"{prefix}{DEDUP}{key}"


def dedup_print(key: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The payload fingerprint of the enqueue reservation of ``key``."""
    return f"{prefix}{PRINT}{key}"


def ledger(key: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The execution ledger key of idempotency key ``key``."""
    return f"{prefix}{LEDGER}{key}"


def done(day: int, prefix: str = DEFAULT_PREFIX) -> str:
    """The bucket of the done entries whose keep ends on day ``day`` (days since the
    epoch, UTC)."""
    return f"{prefix}{DONE}{day}"


def deliveries(delivery_id: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The claim counter of one delivery."""
    return f"{prefix}{DELIVERIES}{delivery_id}"


def dead_letter(record_id: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The key of one dead-letter record."""
    return f"{prefix}{DEAD_LETTER}{record_id}"


def dead_letters_index(
    task: str | None = None, category: str | None = None, prefix: str = DEFAULT_PREFIX
) -> str:
    """The sorted set that indexes the dead letters matching ``task`` and ``category``.

    Each filter combination has its own index, so a filtered listing reads exactly the
    records it returns and never scans the others.
    """
    if task is not None and category is not None:
        return f"{prefix}{DEAD_LETTERS_BY_CATEGORY_TASK}{category}:{task}"
    if task is not None:
        return f"{prefix}{DEAD_LETTERS_BY_TASK}{task}"
    if category is not None:
        return f"{prefix}{DEAD_LETTERS_BY_CATEGORY}{category}"
    return f"{prefix}{DEAD_LETTERS_ALL}"


def dead_letter_indexes(task: str, category: str, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Every index one record with this task and category belongs to."""
    return [
        dead_letters_index(prefix=prefix),
        dead_letters_index(task=task, prefix=prefix),
        dead_letters_index(category=category, prefix=prefix),
        dead_letters_index(task=task, category=category, prefix=prefix),
    ]


def audit(correlation_id: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The audit trail (a list) of one correlation id."""
    return f"{prefix}{AUDIT}{correlation_id}"


def audit_by_time(prefix: str = DEFAULT_PREFIX) -> str:
    """The sorted set of correlation ids by the time of their last event."""
    return f"{prefix}{AUDIT_BY_TIME}"


def counts(prefix: str = DEFAULT_PREFIX) -> str:
    """The hash of counters (``<name>|<task>`` -> count) the audit events move."""
    return f"{prefix}{COUNTS}"


def pattern(prefix: str = DEFAULT_PREFIX) -> str:
    """A ``SCAN MATCH`` pattern for every key under ``prefix`` (glob characters escaped)."""
    escaped = "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix)
    return f"{escaped}*"


def lease(name: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The key of the named lease ``name``."""
    return f"{prefix}{LEASE}{name}"


def state(name: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The key of the state document ``name``."""
    return f"{prefix}{STATE}{name}"


def bucket(name: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The key of the token bucket ``name``."""
    return f"{prefix}{BUCKET}{name}"


def batch(batch_id: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The hash of batch ``batch_id``."""
    return f"{prefix}{BATCH}{batch_id}"


def batch_members(batch_id: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The members of batch ``batch_id`` and their states."""
    return f"{prefix}{BATCH_MEMBERS}{batch_id}"


def namespace(task_name: str) -> str:
    """The key namespace of a task: its name without the version
    (``payments.apply_event.v1`` -> ``payments.apply_event``)."""
    return _VERSION.sub("", task_name)


def namespaced(task_name: str, key: str) -> str:
    """The key the store keeps for ``key`` of task ``task_name``. A key that already
    carries the namespace (a dead letter's, an outbox row's) is kept as it is."""
    prefix = f"{namespace(task_name)}:"
    return key if key.startswith(prefix) else f"{prefix}{key}"


def bare(task_name: str, key: str) -> str:
    """``key`` without the task's namespace: the key the body sees and providers get."""
    prefix = f"{namespace(task_name)}:"
    return key[len(prefix) :] if key.startswith(prefix) else key


def checked(task_name: str, key: object) -> str:
    """``key`` as a string, or PayloadError when it is empty (or blank) or longer than
    :data:`MAX_KEY_LENGTH`: a key that names no effect, or one no marker column or
    provider keeps, is refused where it is chosen."""
    text = key if isinstance(key, str) else str(key)
    problem = None
    if not text.strip():
        problem = ("the idempotency key is empty", "key_empty")
    elif len(text) > MAX_KEY_LENGTH:
        problem = (
            f"the idempotency key is {len(text)} characters, over the limit of {MAX_KEY_LENGTH}",
            "key_too_long",
        )
    if problem is None:
        return text
    raise PayloadError(
        errors=[{"loc": ["idempotency_key"], "msg": problem[0], "type": problem[1]}],
        task=task_name,
    )


def fingerprint(task_name: str, data: dict[str, Any]) -> str:
    """A short fingerprint of a payload: ``<version>:<16 hex digits>`` (BLAKE2b of its
    canonical JSON). ``data`` is the payload as the published task's model validates it
    (``model_dump(mode="json")``, what ``.delay()`` publishes), so the publisher and the
    worker compute it on the same form; the version says which model that was."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.blake2b(canonical.encode(), digest_size=8).hexdigest()
    version = task_name.rpartition(".")[2] if _VERSION.search(task_name) else ""
    return f"{version}:{digest}"


def conflicting(held: str | None, given: str | None) -> bool:
    """Whether two fingerprints of one key name different payloads. Only fingerprints of
    one version compare: a v1 and a v2 payload of one job are different forms, and one
    recorded without a fingerprint (before the upgrade) conflicts with none."""
    if not held or not given or held == given:
        return False
    return held.partition(":")[0] == given.partition(":")[0]


def crc16(data: bytes) -> int:
    """CRC16-XMODEM, the checksum Redis Cluster maps a key to its slot with."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def _partition_tags(count: int) -> tuple[str, ...]:
    """``count`` short hash tags whose slots are evenly spaced (the i-th in the i-th
    ``1/count`` of the slot space): a cluster whose masters hold contiguous equal slot
    ranges (``redis-cli --cluster create``) gets an equal share of them each."""
    tags: list[str | None] = [None] * count
    missing, n = count, 0
    while missing:
        candidate = format(n, "x")
        bucket = (crc16(candidate.encode()) % _SLOTS) * count // _SLOTS
        if tags[bucket] is None:
            tags[bucket], missing = candidate, missing - 1
        n += 1
    return tuple(tag for tag in tags if tag is not None)


#: the hash tags of the partitions, in slot order
PARTITION_TAGS: Final = _partition_tags(CLUSTER_PARTITIONS)


def partition(source: str) -> int:
    """The partition of a job's (or record's, or lease's) keys: from its idempotency key
    (namespaced, :func:`namespaced`), a record's id or a lease's name."""
    digest = hashlib.blake2b(source.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") % CLUSTER_PARTITIONS


def scope(prefix: str, source: str | None, clustered: bool) -> str:
    """The prefix of the keys of ``source`` (see :func:`partition`): ``prefix`` itself on
    one Redis node (the names never change there), and ``prefix{<tag>}:`` on Redis
    Cluster, so that every key of one job hashes to one slot. The one naming function
    both stores use."""
    if not clustered:
        return prefix
    return tagged(prefix, partition(source or ""))


def tagged(prefix: str, index: int) -> str:
    """The prefix of partition ``index`` on Redis Cluster."""
    return f"{prefix}{{{PARTITION_TAGS[index]}}}:"


def scopes(prefix: str, clustered: bool) -> list[str]:
    """Every partition's prefix (one, ``prefix``, on one Redis node): what a fleet-wide
    listing reads."""
    if not clustered:
        return [prefix]
    return [tagged(prefix, index) for index in range(CLUSTER_PARTITIONS)]


def lease_source(name: str) -> str:
    """What a lease's partition is chosen by: its name without a trailing ``:<n>``, so
    the slots of one concurrency limit (``limit:<name>:<n>``) share a slot and one script
    takes the first free one (:meth:`acquire_any`)."""
    return _SLOT_NUMBER.sub("", name)


class Scoped:
    """The key naming of a Redis store part: its prefix, whether it is on a cluster, and
    the prefix of a job's keys (:func:`scope`) or of every partition (:func:`scopes`)."""

    #: the store's client (a ``redis.Redis``, or a ``redis.RedisCluster``)
    client: Any
    prefix: str
    #: on Redis Cluster: every job's keys carry its partition's hash tag
    clustered: bool = False

    def _scope(self, source: str | None) -> str:
        """The prefix of the keys of ``source`` (a job's key, a record's id, a name): the
        plain prefix on one node, the partition's tagged one on a cluster."""
        return scope(self.prefix, source, self.clustered)

    def _scopes(self) -> list[str]:
        """Every partition's prefix (the one plain prefix on one node): what a
        fleet-wide reader visits."""
        return scopes(self.prefix, self.clustered)

    def _share(self, cap: int) -> int:
        """A fleet-wide cap (trails, runs; 0: none) as each partition keeps it: the cap
        itself on one node, its 1/:data:`CLUSTER_PARTITIONS` (rounded up) on a cluster,
        so the fleet keeps about the cap. What is dropped first is the oldest of its
        partition, not of the whole fleet."""
        return -(-cap // CLUSTER_PARTITIONS) if self.clustered and cap > 0 else cap

    def _each(self, command: str, names: list[str]) -> list[Any]:
        """``command`` on each key of ``names`` (one per partition), in one pipeline (on
        a cluster, one round trip per master): the fleet-wide counts' scatter-gather."""
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.execute_command(command, name)
        return list(pipe.execute())
