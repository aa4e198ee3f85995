"""orjson in place of the standard library's JSON for kombu, with the same wire format.

``install()`` re-registers kombu's ``json`` serializer (task bodies, results, events) and
the Redis transport's envelope codec with orjson. Messages stay ``application/json``, so
producers and consumers without it still read them. Differences from kombu's encoder:
``datetime`` goes out as an ISO string (kombu writes a typed marker and reads a
``datetime`` back) and ``Decimal`` or other unknown types become ``str``. Measured here
as an option; the layer does not install it.
"""

from __future__ import annotations

from typing import Any


def _default(value: Any) -> str:
    return str(value)


def dumps(data: Any) -> str:
    """orjson's bytes as text (kombu's registry and transport expect ``str``)."""
    import orjson

    text: str = orjson.dumps(data, default=_default, option=orjson.OPT_NON_STR_KEYS).decode()
    return text


def loads(data: str | bytes | bytearray | memoryview) -> Any:
    import orjson

    if isinstance(data, memoryview):
        data = data.tobytes()
    return orjson.loads(data)


def install() -> None:
    """Swap the codec in this process (call before the worker or producer starts)."""
    import kombu.transport.redis as transport
    from kombu.serialization import registry

    registry.register("json", dumps, loads, content_type="application/json")
    transport.dumps = lambda message, *_, **__: dumps(message)
    transport.loads = loads
