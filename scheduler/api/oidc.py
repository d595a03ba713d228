"""OIDC bearer tokens for people: `OidcVerifier` checks a JWT against the issuer's published
keys and maps its claims to a caller (`ledger.role_claims`). Static tokens stay for machines
(`scheduler.api.auth`); a bearer token that is not shaped as a JWT never reaches this module.

What a token must pass, in order: a compact JWS whose header names an allowed algorithm
(`RS256`/`ES256` by default — `none`, `HS*` and anything else are refused before any key is
touched, so a public key can never serve as an HMAC secret) and a `kid` the issuer's JWKS has;
a valid signature by that key; `iss` equal to the issuer, `aud` naming the audience, `exp`
in the future and `nbf`/`iat` not in the future (each within `clock_skew_s`); then a claim rule
that gives it a role (otherwise 403).

Keys: the discovery document (`<issuer>/.well-known/openid-configuration`) names `jwks_uri`;
the key set is fetched on first use and again when it is older than `jwks_refresh_s`. An
unknown `kid` (the issuer rotated its keys) triggers one refetch, at most once per
`jwks_refetch_min_s`, so a flood of forged `kid`s cannot hammer the issuer. While the issuer
cannot be reached, the keys already fetched keep working; with none, the answer is 503.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import aiohttp
from joserfc import jwt
from joserfc.errors import (
    BadSignatureError,
    ClaimError,
    ExpiredTokenError,
    InvalidKeyIdError,
    JoseError,
)
from joserfc.jwk import KeySet

from ledger.role_claims import ClaimRule, caller_from_claims
from ledger.roles import Caller
from scheduler.api.responses import ApiError

log = logging.getLogger("tally.scheduler.oidc")

ALLOWED_ALGORITHMS = ("RS256", "ES256")
MAX_TOKEN_BYTES = 16_384
MAX_DOCUMENT_BYTES = 1 << 20

FetchJson = Callable[[str], Awaitable[object]]


class IssuerUnavailable(Exception):
    """The discovery document or the JWKS could not be fetched or read."""


@dataclass(frozen=True, slots=True)
class OidcSettings:
    """What the API needs to trust an issuer (config: `auth.oidc`)."""

    issuer: str
    audience: str
    rules: tuple[ClaimRule, ...]
    user_claim: str = "preferred_username"
    discovery_url: str | None = None  # default: <issuer>/.well-known/openid-configuration
    algorithms: tuple[str, ...] = ALLOWED_ALGORITHMS
    clock_skew_s: int = 60
    jwks_refresh_s: float = 3600.0
    jwks_refetch_min_s: float = 30.0
    fetch_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        refused = set(self.algorithms) - set(ALLOWED_ALGORITHMS)
        if refused or not self.algorithms:
            raise ValueError(f"OIDC algorithms must be among {', '.join(ALLOWED_ALGORITHMS)}")

    @property
    def discovery(self) -> str:
        if self.discovery_url is not None:
            return self.discovery_url
        return self.issuer.rstrip("/") + "/.well-known/openid-configuration"


def looks_like_jwt(token: str) -> bool:
    """Whether `token` has the shape of a compact JWS (three base64url parts): static tokens
    (`secrets.token_urlsafe`) never contain a dot."""
    return token.count(".") == 2


def jwt_header(token: str) -> Mapping[str, object]:
    """The protected header of a compact JWS; raises ApiError(401) if it cannot be read."""
    encoded = token.split(".", 1)[0]
    try:
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
        header = json.loads(raw)
    except (binascii.Error, ValueError):
        raise ApiError(401, "the token is not a readable JWT") from None
    if not isinstance(header, dict):
        raise ApiError(401, "the token is not a readable JWT")
    return header


async def fetch_json(url: str, timeout_s: float) -> object:
    """GET `url` as JSON (at most MAX_DOCUMENT_BYTES); raises IssuerUnavailable."""
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url, allow_redirects=False) as response,
        ):
            if response.status != 200:
                raise IssuerUnavailable(f"{url}: HTTP {response.status}")
            body = await response.content.read(MAX_DOCUMENT_BYTES + 1)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise IssuerUnavailable(f"{url}: {exc or type(exc).__name__}") from None
    if len(body) > MAX_DOCUMENT_BYTES:
        raise IssuerUnavailable(f"{url}: larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        return json.loads(body)
    except ValueError:
        raise IssuerUnavailable(f"{url}: not JSON") from None


class OidcVerifier:
    """Verifies people's bearer JWTs for one issuer and caches its keys. `clock` is wall-clock
    seconds (token times are wall clock); `fetch` reads a URL as JSON (default: HTTP)."""

    def __init__(
        self,
        settings: OidcSettings,
        clock: Callable[[], float] = time.time,
        fetch: FetchJson | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.fetch: FetchJson = fetch or (lambda url: fetch_json(url, settings.fetch_timeout_s))
        self.keys: KeySet | None = None
        self.kids: frozenset[str] = frozenset()
        self.jwks_uri: str | None = None
        self.fetched_at: float | None = None  # the last successful JWKS fetch
        self.tried_at: float | None = None  # the last attempt, successful or not
        self.fetches = 0  # JWKS fetches attempted, for tests and logs
        self._lock = asyncio.Lock()

    async def caller(self, token: str) -> Caller:
        """The caller `token` names; raises ApiError 401 (not valid), 403 (valid, but no
        claim rule gives it a role) or 503 (the issuer's keys cannot be had)."""
        if len(token) > MAX_TOKEN_BYTES:
            raise ApiError(401, "the token is too long")
        header = jwt_header(token)
        alg = header.get("alg")
        if alg not in self.settings.algorithms:
            shown = str(alg)[:32]
            raise ApiError(401, f"the token's algorithm {shown!r} is not accepted")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise ApiError(401, "the token names no key (kid)")
        keys = await self._keys_for(kid)
        claims = self._verified_claims(token, keys)
        caller = caller_from_claims(claims, self.settings.rules, self.settings.user_claim)
        if caller is None:
            raise ApiError(403, "the token's claims give it no role")
        return caller

    def _verified_claims(self, token: str, keys: KeySet) -> Mapping[str, object]:
        settings = self.settings
        try:
            decoded = jwt.decode(token, keys, algorithms=list(settings.algorithms))
        except InvalidKeyIdError:
            raise ApiError(401, "the token's key is not among the issuer's keys") from None
        except BadSignatureError:
            raise ApiError(401, "the token's signature is not valid") from None
        except JoseError as exc:
            raise ApiError(401, f"the token is not valid: {exc.error}") from None
        registry = jwt.JWTClaimsRegistry(
            now=int(self.clock()),
            leeway=settings.clock_skew_s,
            iss={"essential": True, "value": settings.issuer},
            aud={"essential": True, "value": settings.audience},
            exp={"essential": True},
        )
        try:
            registry.validate(decoded.claims)
        except ExpiredTokenError:
            raise ApiError(401, "the token has expired") from None
        except ClaimError as exc:
            raise ApiError(401, f"the token's {exc.claim!r} claim is not valid") from None
        except JoseError as exc:
            raise ApiError(401, f"the token is not valid: {exc.error}") from None
        return decoded.claims

    async def _keys_for(self, kid: str) -> KeySet:
        """The key set to check a token of `kid` with, refetched when stale or when `kid` is
        unknown (rate-limited)."""
        async with self._lock:
            now = self.clock()
            stale = self.fetched_at is None or now - self.fetched_at >= self.settings.jwks_refresh_s
            unknown = kid not in self.kids
            may_retry = (
                self.tried_at is None or now - self.tried_at >= self.settings.jwks_refetch_min_s
            )
            if (stale or unknown) and may_retry:
                await self._refresh(now)
            if self.keys is None:
                raise ApiError(503, "the identity provider's keys cannot be fetched")
            return self.keys

    async def _refresh(self, now: float) -> None:
        self.tried_at = now
        self.fetches += 1
        try:
            if self.jwks_uri is None:
                self.jwks_uri = self._jwks_uri(await self.fetch(self.settings.discovery))
            document = await self.fetch(self.jwks_uri)
            keys = KeySet.import_key_set(document)  # type: ignore[arg-type]
        except IssuerUnavailable as exc:
            log.warning("OIDC keys not refreshed: %s", exc)
            return
        except (JoseError, ValueError, TypeError, KeyError) as exc:
            self.jwks_uri = None  # discover again next time
            log.warning("OIDC keys not refreshed: the JWKS cannot be read: %s", exc)
            return
        self.keys = keys
        self.kids = frozenset(k.kid for k in keys.keys if k.kid)
        self.fetched_at = now
        log.info("OIDC keys refreshed: %d key(s)", len(self.kids))

    def _jwks_uri(self, document: object) -> str:
        if not isinstance(document, dict):
            raise IssuerUnavailable("the discovery document is not a JSON object")
        if document.get("issuer") != self.settings.issuer:
            raise IssuerUnavailable(
                f"the discovery document names issuer {str(document.get('issuer'))[:200]!r}, "
                f"not {self.settings.issuer!r}"
            )
        uri = document.get("jwks_uri")
        if not isinstance(uri, str) or not uri.startswith(("https://", "http://")):
            raise IssuerUnavailable("the discovery document has no jwks_uri")
        return uri
