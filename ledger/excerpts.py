"""Bounded excerpts of untrusted text: what a dead letter, an alert or a log line may carry of an
input without carrying the input.

Any producer can put anything in a message; whatever Tally repeats of it (a dead letter's
reason, payload and event id, a log line) must stay small, or one oversized message makes an
oversized dead letter the broker refuses. `excerpt(text, limit)` keeps at most `limit`
characters; when it had to cut, the text says so and names the original's length and the first
12 hex digits of its SHA-256, so the original can still be recognised:

    "abc…abc…[cut: 1048576 chars, sha256 3f2a9c0d1e4b]"

Invariants:
- `len(excerpt(t, n).text) <= n` for every `t` and every `n >= MIN_LIMIT`;
- a text of at most `limit` characters is returned unchanged (`cut` is False);
- pure and deterministic: the same text and limit always give the same excerpt.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

ID_LIMIT = 256  # an event id, a topic, an incarnation: what names a thing
TEXT_LIMIT = 2048  # a reason, a payload: what explains a thing
DIGEST_HEX = 12
MIN_LIMIT = 64  # room for the marker, whatever the original's length
_MARK = "…[cut: {size} chars, sha256 {digest}]"


@dataclass(frozen=True, slots=True)
class Excerpt:
    """At most `limit` characters of a text; `size` is the original's length in characters and
    `digest` its SHA-256 prefix (empty when nothing was cut)."""

    text: str
    size: int
    digest: str = ""

    @property
    def cut(self) -> bool:
        return bool(self.digest)


def digest_of(text: str) -> str:
    """The first `DIGEST_HEX` hex digits of the SHA-256 of `text` (UTF-8, lone surrogates
    escaped)."""
    data = text.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()[:DIGEST_HEX]


def excerpt(text: str, limit: int = TEXT_LIMIT) -> Excerpt:
    """At most `limit` characters of `text`: the text itself when it fits, else its head and a
    marker with the original's length and hash."""
    if limit < MIN_LIMIT:
        raise ValueError(f"an excerpt limit must be at least {MIN_LIMIT} characters")
    if len(text) <= limit:
        return Excerpt(text, len(text))
    digest = digest_of(text)
    mark = _MARK.format(size=len(text), digest=digest)
    return Excerpt(text[: limit - len(mark)] + mark, len(text), digest)


def bounded(text: str, limit: int = TEXT_LIMIT) -> str:
    """`excerpt(text, limit).text`: the bounded text alone."""
    if len(text) <= limit:  # the common case, without building an Excerpt
        return text
    return excerpt(text, limit).text


def bounded_or_none(text: str | None, limit: int = ID_LIMIT) -> str | None:
    return None if text is None else bounded(text, limit)


def shown(value: Any, limit: int = ID_LIMIT) -> str:
    """At most `limit` characters of `repr(value)`, for a message about an untrusted value.
    Never raises: a value nested too deep for `repr` (JSON may nest 1,024 levels) or an integer
    too long for it is named by its type instead."""
    try:
        text = repr(value)
    except (RecursionError, ValueError):
        return f"<{type(value).__name__} that cannot be shown>"
    return bounded(text, limit)
