"""Who may use ``mpsearch serve``: the access token, the Host check and the cross-site check.

Consumes a request's method, address and headers; produces a refusal (status, one line) or
nothing. Three locks, as Jupyter has them:

* **a per-start token**: ``mpsearch serve`` prints its address with ``?token=...``; the first
  visit stores the token in a cookie (``HttpOnly``, ``SameSite=Strict``, named after a digest
  of the token, so two servers on one machine keep theirs). Every request but the static files
  needs it (cookie, ``?token=`` or an ``X-Mpsearch-Token`` header): other users of the machine
  see nothing without it.
* **the Host check** (DNS rebinding): on loopback only the loopback names are answered,
  ``[::1]`` included.
* **the cross-site check** on every state-changing request (POST, PUT, PATCH, DELETE: uploads,
  jobs, cancel, resume): ``Origin`` must be present, not ``null`` and this server, and
  ``Sec-Fetch-Site`` (when the browser sends it) ``same-origin`` or ``none``.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["LOOPBACK_HOSTS", "SAFE_METHODS", "Access", "host_name", "new_token"]

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
_OPEN_PREFIXES = ("/static/", "/favicon.ico")
_SITES = ("same-origin", "none")
TOKEN_HEADER = "x-mpsearch-token"
_LOGIN = ("open the address with ?token=... that `mpsearch serve` printed when it started")


def new_token() -> str:
    """A fresh random access token (URL-safe, 32 characters)."""
    return secrets.token_urlsafe(24)


def host_name(host: str) -> str:
    """The name part of a Host header: ``[::1]:8765`` -> ``[::1]``, ``a.b:80`` -> ``a.b``."""
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        return host[:end + 1] if end > 0 else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


@dataclass(frozen=True, slots=True)
class Access:
    """The access rules of one server: its token and, when set, the Host names it answers."""

    token: str | None
    hosts: tuple[str, ...] | None = None

    @property
    def cookie(self) -> str:
        """The name of the token's cookie (a digest of the token: one per server)."""
        digest = hashlib.sha256((self.token or "").encode()).hexdigest()[:10]
        return f"mpsearch_{digest}"

    def set_cookie(self) -> str:
        """The ``Set-Cookie`` value that stores the token in the browser."""
        return f"{self.cookie}={self.token}; Path=/; HttpOnly; SameSite=Strict"

    def has_token(self, query: Mapping[str, str], headers: Mapping[str, str],
                  cookies: Mapping[str, str]) -> bool:
        if self.token is None:
            return True
        given = (headers.get(TOKEN_HEADER) or cookies.get(self.cookie) or query.get("token")
                 or "")
        return secrets.compare_digest(given.encode(), self.token.encode())

    def refuse(self, method: str, path: str, query: Mapping[str, str],
               headers: Mapping[str, str], cookies: Mapping[str, str]
               ) -> tuple[int, str] | None:
        """(status, one-line reason) when the request must be refused, else None."""
        host = headers.get("host", "")
        if self.hosts is not None and host_name(host) not in self.hosts:
            return 400, (f"unknown Host header '{host[:60]}'; this server answers "
                         f"{', '.join(self.hosts)} only (open the address it printed)")
        if method.upper() not in SAFE_METHODS:
            refused = self._cross_site(headers)
            if refused is not None:
                return 403, refused
        if path.startswith(_OPEN_PREFIXES) or self.has_token(query, headers, cookies):
            return None
        return 403, f"missing or wrong access token; {_LOGIN}"

    def _cross_site(self, headers: Mapping[str, str]) -> str | None:
        origin = headers.get("origin")
        site = headers.get("sec-fetch-site")
        if origin is None:
            return ("cross-site check: the request has no Origin header; send it from the "
                    "mpsearch page (API clients: add 'Origin: http://HOST:PORT')")
        if origin == "null":
            return ("cross-site request from an opaque origin (Origin: null) refused; use the "
                    "mpsearch page itself")
        if urlsplit(origin).netloc.lower() != headers.get("host", "").lower():
            return f"cross-site request from {origin[:80]} refused"
        if site is not None and site not in _SITES:
            return f"cross-site request (Sec-Fetch-Site: {site[:20]}) refused"
        return None
