"""Lua scripts sent by their digest (``EVALSHA``), whole only when the server lacks them.

A script sent whole (``EVAL``) costs its body on the wire and a digest of it on the
server at every call; the transport's idle path (the keeper's beat and sweep, the
multi-queue fetch) sends one every second or few per consumer. Sent by digest, a
``NOSCRIPT`` reply (a restarted or failed-over server, a ``SCRIPT FLUSH``) sends it whole
once, which loads it again.
"""

from __future__ import annotations

import hashlib
from functools import cache
from typing import Any

from redis.exceptions import NoScriptError


@cache
def sha_of(text: str) -> str:
    """The digest Redis names ``text`` by."""
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


def call(client: Any, text: str, numkeys: int, *keys_and_args: Any) -> Any:
    """Run the script ``text`` by its digest on ``client``, sending it whole when the
    server does not know it (one more command, once)."""
    try:
        return client.evalsha(sha_of(text), numkeys, *keys_and_args)
    except NoScriptError:
        return client.eval(text, numkeys, *keys_and_args)
