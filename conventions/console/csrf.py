"""CSRF protection: a signed, dated double-submit token on every state-changing request.

The browser gets a random nonce in a ``SameSite=Strict``, ``HttpOnly`` cookie; each form
carries a token: the time it was issued and an HMAC-SHA256, under the console's secret,
of the nonce, the actor and that time. A POST is accepted only when its token verifies
against the cookie's nonce *and* the actor the authorizer gives now, and was issued less
than :data:`MAX_AGE` ago: a page of another site cannot read the cookie to build the
token, a planted cookie does not come with a valid signature, a token leaked for one
actor is worthless for another, and a leaked token dies within a working shift.

Every process serving one console must sign with the same secret (``console_app(...,
secret=)``, the ``conventions_console_secret`` setting, or ``CONVENTIONS_CONSOLE_SECRET``
for ``conventions web``): a token one process issued is then accepted by the others
behind a load balancer. Without one, each process signs with a random secret of its own.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

#: the cookie holding the nonce, and the form field (or header) holding the token
COOKIE = "cc_console_csrf"
FIELD = "csrf_token"
HEADER = "x-csrf-token"
#: how long a token holds after the page that carries it was served (seconds): a
#: working shift; a form left open longer is refused, and a reload gives a fresh one
MAX_AGE = 8 * 3600
#: how far in the future an issue time may be (seconds): the clocks of two processes
#: behind one load balancer may differ that much
SKEW = 300
#: the shortest secret the console accepts (bytes)
MIN_SECRET = 16


def new_nonce() -> str:
    return secrets.token_urlsafe(24)


def _signature(secret: bytes, nonce: str, actor: str, issued: int) -> str:
    message = f"{nonce}\x00{actor}\x00{issued}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def token(secret: bytes, nonce: str, actor: str, issued: float | None = None) -> str:
    """The token a form of ``actor`` carries for the cookie's ``nonce``, issued at
    ``issued`` (Unix seconds; default now): ``<issued>.<signature>``."""
    when = int(time.time() if issued is None else issued)
    return f"{when}.{_signature(secret, nonce, actor, when)}"


def valid(
    secret: bytes,
    nonce: str | None,
    actor: str,
    submitted: str | None,
    now: float | None = None,
) -> bool:
    """Does ``submitted`` prove the request came from a page the console served, less
    than :data:`MAX_AGE` ago?"""
    if not nonce or not submitted:
        return False
    issued_text, _, signature = submitted.partition(".")
    if not (issued_text.isascii() and issued_text.isdigit()) or len(issued_text) > 12:
        return False
    issued = int(issued_text)
    current = time.time() if now is None else now
    if not current - MAX_AGE <= issued <= current + SKEW:
        return False
    expected = _signature(secret, nonce, actor, issued).encode()
    # bytes, not str: compare_digest raises TypeError on a non-ASCII str (a forged token)
    return hmac.compare_digest(expected, signature.encode("utf-8", "replace"))


#: the setting (``app.conf``) holding the secret every console process shares
SETTING = "conventions_console_secret"
#: the environment variable ``conventions web`` reads it from
ENV = "CONVENTIONS_CONSOLE_SECRET"


def shared_secret(conf: object, given: bytes | str | None = None) -> bytes | None:
    """The secret every process of one console signs with: ``given`` (``console_app``'s
    ``secret=``), else the app's ``conventions_console_secret`` setting; None when neither
    is set. ValueError for one shorter than :data:`MIN_SECRET` bytes."""
    value = given
    if value is None:
        getter = getattr(conf, "get", None)
        value = getter(SETTING) if callable(getter) else None
    if value is None or value == "":
        return None
    secret = value.encode() if isinstance(value, str) else bytes(value)
    if len(secret) < MIN_SECRET:
        raise ValueError(
            f"the console's secret must be at least {MIN_SECRET} bytes (e.g. the output of "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return secret
