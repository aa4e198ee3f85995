"""CSRF protection: a signed double-submit token on every state-changing request.

The browser gets a random nonce in a ``SameSite=Strict``, ``HttpOnly`` cookie; each form
carries a token that is the nonce signed (HMAC-SHA256) with the console's secret and
bound to the actor. A POST is accepted only when its token verifies against the
cookie's nonce *and* the actor the authorizer gives now: a page of another site cannot
read the cookie to build the token, a planted cookie does not come with a valid
signature, and a token leaked for one actor is worthless for another.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

#: the cookie holding the nonce, and the form field (or header) holding the token
COOKIE = "cc_console_csrf"
FIELD = "csrf_token"
HEADER = "x-csrf-token"


def new_nonce() -> str:
    return secrets.token_urlsafe(24)


def token(secret: bytes, nonce: str, actor: str) -> str:
    """The token a form of ``actor`` carries for the cookie's ``nonce``."""
    message = f"{nonce}\x00{actor}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def valid(secret: bytes, nonce: str | None, actor: str, submitted: str | None) -> bool:
    """Does ``submitted`` prove the request came from a page the console served?"""
    if not nonce or not submitted:
        return False
    return hmac.compare_digest(token(secret, nonce, actor), submitted)
