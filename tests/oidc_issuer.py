"""A real OIDC issuer on loopback for the tests (no tests here): an HTTP server in a thread
with the discovery document, the JWKS (keys can be rotated), and the authorization-code flow
(`/authorize` signs the person in at once as `Issuer.person` and redirects back with a code;
`/token` trades it for a signed ID token and access token). Tokens are signed with authlib's
JOSE library (`joserfc`, what `authlib.jose` now defers to); `forge_*` build the tokens an
attacker would send (`alg: none`, HS256 keyed with the issuer's public key).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from joserfc import jwt
from joserfc.jwk import ECKey, KeySet, RSAKey

AUDIENCE = "tally"
CLIENT_ID = "tally-dashboard"
CLIENT_SECRET = "dashboard-client-secret-0123456789"
Key = RSAKey | ECKey


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@functools.cache  # generating an RSA key takes a while: one per kid per test run
def rsa_key(kid: str) -> RSAKey:
    return RSAKey.generate_key(2048, {"kid": kid, "alg": "RS256", "use": "sig"}, private=True)


@functools.cache
def ec_key(kid: str) -> ECKey:
    return ECKey.generate_key("P-256", {"kid": kid, "alg": "ES256", "use": "sig"}, private=True)


def renamed(key: RSAKey, kid: str) -> RSAKey:
    """`key` published under another kid (a key that claims to be the issuer's)."""
    return RSAKey.import_key({**key.as_dict(private=True), "kid": kid})


class Issuer:
    """The issuer's state: its signing keys (the JWKS publishes them all), the person the
    authorization endpoint signs in, and what was asked of it."""

    def __init__(self) -> None:
        self.keys: list[Key] = [rsa_key("rsa-1")]
        self.person: dict[str, Any] = {"preferred_username": "ada", "groups": ["vision-members"]}
        self.jwks_requests = 0
        self.codes: dict[str, dict[str, Any]] = {}
        self.url = ""  # set when served
        self._server: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------------ tokens

    def claims(self, **overrides: Any) -> dict[str, Any]:
        """Claims of a token valid now for AUDIENCE; `overrides` replace or (None) drop."""
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.url,
            "aud": AUDIENCE,
            "sub": "user-1",
            "iat": now,
            "nbf": now,
            "exp": now + 300,
            **self.person,
        }
        claims.update(overrides)
        return {k: v for k, v in claims.items() if v is not None}

    def sign(self, claims: Mapping[str, Any], key: Key | None = None) -> str:
        key = key or self.keys[-1]
        header = {"alg": key.alg, "kid": key.kid, "typ": "JWT"}
        return jwt.encode(header, dict(claims), key, algorithms=[str(key.alg)])

    def token(self, **overrides: Any) -> str:
        """A signed token with the newest key."""
        return self.sign(self.claims(**overrides))

    def forge_unsigned(self, **overrides: Any) -> str:
        """`alg: none`, no signature, naming a real key."""
        header = {"alg": "none", "kid": self.keys[-1].kid, "typ": "JWT"}
        payload = json.dumps(self.claims(**overrides)).encode()
        return f"{_b64(json.dumps(header).encode())}.{_b64(payload)}."

    def forge_hs256(self, **overrides: Any) -> str:
        """HS256 keyed with the issuer's public key in PEM: the algorithm-confusion attack."""
        key = self.keys[-1]
        header = {"alg": "HS256", "kid": key.kid, "typ": "JWT"}
        payload = json.dumps(self.claims(**overrides)).encode()
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(payload)}"
        secret = key.as_pem(private=False)
        mac = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
        return f"{signing_input}.{_b64(mac)}"

    def rotate(self, kid: str) -> Key:
        """A new RSA key `kid` replaces every old one (the JWKS drops them); returns the old."""
        old = self.keys[-1]
        self.keys = [rsa_key(kid)]
        return old

    def jwks(self) -> dict[str, Any]:
        return KeySet(list(self.keys)).as_dict(private=False)

    def discovery(self) -> dict[str, Any]:
        return {
            "issuer": self.url,
            "jwks_uri": f"{self.url}/jwks",
            "authorization_endpoint": f"{self.url}/authorize",
            "token_endpoint": f"{self.url}/token",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256", "ES256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            "scopes_supported": ["openid", "profile", "email"],
        }

    # ------------------------------------------------------------------ the flow

    def authorize(self, query: Mapping[str, str]) -> str:
        """Sign `person` in: the redirect back to the client with a code."""
        code = secrets.token_urlsafe(16)
        self.codes[code] = dict(query)
        back = {"code": code, "state": query.get("state", "")}
        return f"{query['redirect_uri']}?{urlencode(back)}"

    def exchange(self, form: Mapping[str, str], basic: tuple[str, str] | None) -> dict[str, Any]:
        client = basic or (form.get("client_id", ""), form.get("client_secret", ""))
        if client != (CLIENT_ID, CLIENT_SECRET):
            raise PermissionError("invalid_client")
        asked = self.codes.pop(form.get("code", ""), None)
        if asked is None or asked.get("redirect_uri") != form.get("redirect_uri"):
            raise PermissionError("invalid_grant")
        extra = {"nonce": asked["nonce"]} if "nonce" in asked else {}
        id_token = self.token(aud=CLIENT_ID, **extra)
        return {
            "access_token": self.token(),
            "id_token": id_token,
            "token_type": "Bearer",
            "expires_in": 300,
        }

    # ------------------------------------------------------------------ serving

    @contextmanager
    def serving(self) -> Iterator[Issuer]:
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _json(self, status: int, body: Any) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                if url.path == "/.well-known/openid-configuration":
                    self._json(200, issuer.discovery())
                elif url.path == "/jwks":
                    issuer.jwks_requests += 1
                    self._json(200, issuer.jwks())
                elif url.path == "/authorize" and "redirect_uri" in query:
                    self.send_response(302)
                    self.send_header("Location", issuer.authorize(query))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self._json(404, {"error": "not_found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                basic = None
                scheme, _, value = (self.headers.get("Authorization") or "").partition(" ")
                if scheme.lower() == "basic":
                    user, _, password = base64.b64decode(value).decode().partition(":")
                    basic = (user, password)
                if urlsplit(self.path).path != "/token":
                    self._json(404, {"error": "not_found"})
                    return
                try:
                    self._json(200, issuer.exchange(form, basic))
                except PermissionError as exc:
                    self._json(400, {"error": str(exc)})

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        self._server = server
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()
            thread.join(5)
