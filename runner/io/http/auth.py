"""How a webhook sender proves itself, the way Meta signs its webhooks (SPEC E4).

* The subscription handshake: ``GET /webhook?hub.mode=subscribe&hub.verify_token=T&
  hub.challenge=C`` is answered with ``C`` when ``T`` equals the configured verify token,
  and refused (403) otherwise.
* Every delivery: ``POST /webhook`` carries ``X-Hub-Signature-256: sha256=<hex>``, the
  HMAC-SHA256 of the raw request body keyed with the app secret.  The body is checked
  before it is parsed: a request that is not signed by the secret holder touches nothing.

Both comparisons are constant-time (``hmac.compare_digest``), so the time an answer takes
says nothing about how much of a guess was right.  Neither the secret nor the token is ever
logged or echoed; the only thing echoed is the challenge of a successful handshake.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from enum import Enum
from urllib.parse import parse_qs

SIGNATURE_HEADER = b"x-hub-signature-256"
_PREFIX = "sha256="
#: a challenge longer than this is refused (Meta's is a short number)
MAX_CHALLENGE = 256


class Verdict(Enum):
    """The outcome of a signature check; the app maps it to a status code."""

    VALID = "valid"
    MISSING = "missing"  # no signature header: 401
    INVALID = "invalid"  # malformed or wrong: 403
    UNCONFIGURED = "unconfigured"  # no secret configured: nothing can be verified, 403


@dataclass(frozen=True)
class WebhookAuth:
    """The app secret and the verify token.  ``repr`` never shows them."""

    secret: bytes | None = field(default=None, repr=False)
    verify_token: str | None = field(default=None, repr=False)


def sign(secret: bytes, body: bytes) -> str:
    """The header value a sender puts on ``body`` (tests and the bench sign with it)."""
    return _PREFIX + hmac.new(secret, body, hashlib.sha256).hexdigest()


def check_signature(auth: WebhookAuth, header: bytes | None, body: bytes) -> Verdict:
    """Check ``X-Hub-Signature-256`` against the raw body, in constant time."""
    if auth.secret is None:
        return Verdict.UNCONFIGURED
    if header is None:
        return Verdict.MISSING
    try:
        given = header.decode("ascii")
    except UnicodeDecodeError:
        return Verdict.INVALID
    if not given.startswith(_PREFIX):
        return Verdict.INVALID
    expected = sign(auth.secret, body)
    # compare_digest over ASCII text: the same time whatever prefix of the guess matches
    return Verdict.VALID if hmac.compare_digest(given.lower(), expected) else Verdict.INVALID


def handshake(auth: WebhookAuth, query_string: bytes) -> str | None:
    """The challenge to echo for a valid subscription handshake, else None (403)."""
    if auth.verify_token is None:
        return None
    try:
        query = parse_qs(query_string.decode("ascii"), keep_blank_values=True,
                         max_num_fields=16, strict_parsing=False)
    except (UnicodeDecodeError, ValueError):
        return None
    mode = query.get("hub.mode", [])
    token = query.get("hub.verify_token", [])
    challenge = query.get("hub.challenge", [])
    if mode != ["subscribe"] or len(token) != 1 or len(challenge) != 1:
        return None
    given = token[0].encode("utf-8", errors="surrogateescape")
    if not hmac.compare_digest(given, auth.verify_token.encode("utf-8")):
        return None
    answer = challenge[0]
    if not answer or len(answer) > MAX_CHALLENGE or not answer.isprintable():
        return None
    return answer
