"""Who may call what: API keys, tenants and CORS.

Client keys guard the OpenAI surface (every path under /v1, /tokenize and /detokenize) once any is
set; the admin key alone opens /admin when it is set (else any client key does); /metrics needs
either when `protect_metrics` is on; /health and CORS preflights never need one. A key may name a
tenant: the middleware puts the key's Tenant on `request.state.tenant`, and the request path
(serving/api_server.py) takes from it the request's prefix-cache salt and its default SLO class.
Keys are compared as SHA-256 digests with hmac.compare_digest, against every key, in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any

import yaml

from serving.openai_protocol import error_body

CLIENT_PREFIXES = ("/v1", "/tokenize", "/detokenize")
ADMIN_PREFIX = "/admin"
METRICS_PATH = "/metrics"
TENANT_SALT = "tenant:"        # every tenant's salt starts so; no other request's salt does
CORS_METHODS = ("GET", "POST", "OPTIONS")
CORS_HEADERS = ("Authorization", "Content-Type", "X-SLO-Class")


class AuthError(ValueError):
    """A key or a keys file that cannot be used (one line)."""


@dataclass(frozen=True)
class Tenant:
    """What a request's key says about it. `name` None: a key naming no tenant."""

    name: str | None = None
    slo_class: str | None = None      # the request's SLO class unless its body or X-SLO-Class names one

    def cache_salt(self, salt: str | None) -> str | None:
        """The prefix-cache salt of a request of this tenant whose body gave `salt`: a tenant's requests
        share blocks only with each other (a body salt splits them further, never reaches past them)."""
        if self.name is not None:
            return f"{TENANT_SALT}{self.name}" + (f":{salt}" if salt is not None else "")
        if salt is not None and salt.startswith(TENANT_SALT):   # cannot pose as a tenant
            return f"client:{salt}"
        return salt


@dataclass(frozen=True)
class Key:
    key: str = field(repr=False)
    tenant: Tenant = Tenant()

    @property
    def digest(self) -> bytes:
        return _digest(self.key)


@dataclass(frozen=True)
class AuthConfig:
    client_keys: tuple[Key, ...] = ()
    admin_key: str | None = field(default=None, repr=False)
    protect_metrics: bool = False
    allowed_origins: tuple[str, ...] = ()

    @classmethod
    def from_api_key(cls, key: str | None) -> "AuthConfig":
        """One client key (ApiConfig.api_key): it guards /v1 and /admin."""
        return cls(client_keys=(Key(key),) if key else ())

    @property
    def enabled(self) -> bool:
        return bool(self.client_keys or self.admin_key)


def parse_keys(value: str | list[str] | None, *, comma_separated: bool = False) -> list[str]:
    """Client keys from a setting: a string (or, `comma_separated`, several joined by commas) or a list."""
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    keys: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise AuthError(f"an API key must be a string, got {item!r}")
        parts = item.split(",") if comma_separated else [item]
        keys += [p.strip() for p in parts if p.strip()]
    return keys


def load_keys_file(path: str) -> list[Key]:
    """`{keys: [{key: "...", tenant: "team-a", slo_class: "batch"}, {key: "..."}]}`."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except OSError as e:
        raise AuthError(f"cannot read api_keys_file {path}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise AuthError(f"api_keys_file {path} is not valid YAML: {str(e).splitlines()[0]}") from e
    if not isinstance(data, dict) or set(data) - {"keys"} or not isinstance(data.get("keys", []), list):
        raise AuthError(f"api_keys_file {path}: expected {{keys: [{{key: ..., tenant: ..., slo_class: ...}}]}}")
    keys = []
    for i, entry in enumerate(data.get("keys") or []):
        where = f"api_keys_file {path}: keys[{i}]"
        if not isinstance(entry, dict) or set(entry) - {"key", "tenant", "slo_class"}:
            raise AuthError(f"{where}: expected a mapping with key and optionally tenant, slo_class")
        key, tenant, slo = entry.get("key"), entry.get("tenant"), entry.get("slo_class")
        if not isinstance(key, str) or not key.strip():
            raise AuthError(f"{where}: key must be a non-empty string")
        if tenant is not None and (not isinstance(tenant, str) or not tenant or ":" in tenant):
            raise AuthError(f"{where}: tenant must be a non-empty string without ':'")
        if slo is not None and not isinstance(slo, str):
            raise AuthError(f"{where}: slo_class must be a string")
        keys.append(Key(key.strip(), Tenant(tenant, slo)))
    return keys


def merge_keys(keys: list[Key]) -> tuple[Key, ...]:
    """One Key per key string; the same key given twice must say the same."""
    by_key: dict[str, Key] = {}
    for k in keys:
        seen = by_key.setdefault(k.key, k)
        if seen.tenant != k.tenant:
            raise AuthError("an API key is given twice with different tenants or SLO classes")
    return tuple(by_key.values())


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


class AuthMiddleware:
    """Checks the key of each HTTP request by its path; sets scope["state"]["tenant"] on a client key's."""

    def __init__(self, app, auth: AuthConfig) -> None:
        self.app, self.auth = app, auth
        self.client = [(k.digest, k.tenant) for k in auth.client_keys]
        self.admin = _digest(auth.admin_key) if auth.admin_key else None

    def _client_tenant(self, digest: bytes) -> Tenant | None:
        found = None
        for known, tenant in self.client:      # every key compared, whichever matches
            if hmac.compare_digest(known, digest):
                found = tenant
        return found

    def _is_admin(self, digest: bytes) -> bool:
        return self.admin is not None and hmac.compare_digest(self.admin, digest)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path: str = scope["path"]
        token = _bearer(scope.get("headers", []))
        digest = _digest(token) if token else b""
        if _under(path, CLIENT_PREFIXES):
            if self.client:
                tenant = self._client_tenant(digest)
                if tenant is None:
                    return await _reject(send, 401, "a valid API key is required (Authorization: Bearer KEY)")
                scope.setdefault("state", {})["tenant"] = tenant
        elif _under(path, (ADMIN_PREFIX,)):
            if self.admin is not None:
                if not self._is_admin(digest):
                    if self._client_tenant(digest) is not None:
                        return await _reject(send, 403, "this key may not call /admin: it takes the admin key",
                                             "permission_error", None)
                    return await _reject(send, 401, "a valid admin API key is required for /admin")
            elif self.client and self._client_tenant(digest) is None:
                return await _reject(send, 401, "a valid API key is required for /admin")
        elif path == METRICS_PATH and self.auth.protect_metrics and self.auth.enabled:
            if not self._is_admin(digest) and self._client_tenant(digest) is None:
                return await _reject(send, 401, "a valid API key is required for /metrics")
        await self.app(scope, receive, send)


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in prefixes)


async def _reject(send, status: int, message: str, type_: str = "authentication_error",
                  code: str | None = "invalid_api_key") -> None:
    body = json.dumps(error_body(message, type_, None, code)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install_auth(app: Any, auth: AuthConfig) -> None:
    """The key checks, and outside them (so a preflight needs no key, and a 401 carries the CORS headers)
    starlette's CORSMiddleware for `auth.allowed_origins`. Call before the app serves its first request."""
    if auth.enabled:
        app.add_middleware(AuthMiddleware, auth=auth)
    if auth.allowed_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(auth.allowed_origins),
                           allow_methods=list(CORS_METHODS), allow_headers=list(CORS_HEADERS))
