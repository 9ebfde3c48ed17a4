"""Who may reach the dashboard and what a request may do: the names it answers to, basic
authentication and its throttle, the login token's sessions, the cross-site request forgery
token, the same-origin check, and the headers every response carries.

Pure functions over header values and secrets, imported by the ASGI layer
(`cronjob.web.application`), which applies them to every request before any page runs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import math
import re
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

# Nothing stored can run script or load anything: scripts, styles and images from the
# dashboard itself only (its one script, the auto-refresh, is a file it serves; no inline
# script runs, and charts are inline SVG, which is markup, not a resource), forms that post
# back to it alone, and no page may frame it. The referrer goes to the dashboard alone: with
# none at all, a browser posts its forms as from an opaque origin ("null").
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
)

CSRF_COOKIE = "jobrunner_csrf"
CSRF_FIELD = "csrf_token"
SESSION_COOKIE = "jobrunner_session"
TOKEN_PARAMETER = "token"

DEFAULT_PORTS = {"http": 80, "https": 443}
# A name as DNS writes it (letters, digits, hyphens, dots; underscores, which some internal
# names carry), an IPv4 address among them; an IPv6 address goes in brackets.
_HOST_NAME = re.compile(r"[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?")


@dataclass(frozen=True)
class HostName:
    """A name the dashboard answers to, and its port (None: any port)."""

    name: str  # lower case; an IPv6 address in brackets, in its shortest form
    port: int | None

    @classmethod
    def parse(cls, text: str, default_port: int | None = None) -> HostName | None:
        """`name[:port]`, as a Host header or --allowed-host writes it; None when it is not
        one. Without a port, the port is `default_port`."""
        text = text.strip().lower()
        if text.startswith("["):
            name, bracket, rest = text[1:].partition("]")
            try:
                address = ipaddress.IPv6Address(name)
            except ValueError:
                return None
            name = f"[{address.compressed}]" if bracket else ""
        else:
            name, colon, port_text = text.partition(":")
            rest = colon + port_text
        if not name or (not name.startswith("[") and not _HOST_NAME.fullmatch(name)):
            return None
        if not rest:
            return cls(name, default_port)
        digits = rest[1:]
        if rest[0] != ":" or not digits.isascii() or not digits.isdigit() or len(digits) > 5:
            return None
        port = int(digits)
        return cls(name, port) if 0 < port < 65536 else None


class AllowedHosts:
    """The names the dashboard answers to (its `Host`), and the origins its forms may come
    from: the same names. A page of another name (a DNS rebinding one, whose name now points
    at this machine) gets no answer, and so can neither read a page nor post a form."""

    def __init__(self, names: Iterable[HostName]) -> None:
        self.names = tuple(dict.fromkeys(names))

    @classmethod
    def parse(cls, names: Iterable[str]) -> AllowedHosts:
        """ValueError naming the first that is not `name[:port]`."""
        parsed = []
        for text in names:
            name = HostName.parse(text)
            if name is None:
                raise ValueError(f"not a host name, with an optional :port: {text[:100]!r}")
            parsed.append(name)
        return cls(parsed)

    @classmethod
    def of_server(cls, bound: str, port: int, also: Iterable[str] = ()) -> AllowedHosts:
        """What `jobrunner web` answers to: its address and this machine's loopback names,
        each with its port, and the names `also` adds (--allowed-host)."""
        shown = f"[{bound}]" if ":" in bound and not bound.startswith("[") else bound
        own = [f"{name}:{port}" for name in (shown, "localhost", "127.0.0.1", "[::1]")]
        return cls.parse([*own, *also])

    def allows(self, host: str | None, scheme: str) -> bool:
        """Whether a request's `Host` header names the dashboard."""
        given = HostName.parse(host, DEFAULT_PORTS.get(scheme)) if host else None
        return given is not None and self._holds(given)

    def allows_origin(self, origin: str) -> bool:
        """Whether a browser's `Origin` is one of the dashboard's own."""
        parts = urlsplit(origin)
        if parts.scheme not in DEFAULT_PORTS or not parts.netloc or "@" in parts.netloc:
            return False
        given = HostName.parse(parts.netloc, DEFAULT_PORTS[parts.scheme])
        return given is not None and self._holds(given)

    def shown(self) -> str:
        return ", ".join(n.name if n.port is None else f"{n.name}:{n.port}" for n in self.names)

    def _holds(self, given: HostName) -> bool:
        return any(n.name == given.name and n.port in (None, given.port) for n in self.names)


@dataclass(frozen=True)
class BasicAuth:
    """The one user and password `--basic-auth-env` names, kept as digests."""

    user: str
    digest: bytes  # sha256 of "user:password"

    @classmethod
    def from_credentials(cls, credentials: str) -> BasicAuth:
        """`user:password`, as the variable holds it; ValueError when it is not that."""
        user, colon, password = credentials.partition(":")
        if not colon or not user or not password:
            raise ValueError("expected user:password, both non-empty")
        return cls(user, _digest(credentials.encode()))

    def user_of(self, authorization: str | None) -> str | None:
        """The user an `Authorization: Basic ...` header proves, or None.

        Compared as fixed-length digests in constant time: neither the password nor its
        length shows in how long a refusal takes.
        """
        if not authorization or authorization[:6].lower() != "basic ":
            return None
        try:
            given = base64.b64decode(authorization[6:].strip(), validate=True)
        except (binascii.Error, ValueError):
            return None
        if hmac.compare_digest(_digest(given), self.digest):
            return self.user
        return None


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


class CsrfTokens:
    """Per-browser tokens for the forms that change state (signed double submit).

    A token is a random nonce and its signature under this process's secret; the browser
    keeps it in a SameSite=Strict cookie and each form posts it back in a field. A post is
    accepted only when both are present, equal, and signed here: another site can make a
    browser post, but can neither read the token nor plant one of ours.
    """

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def issue(self) -> str:
        nonce = secrets.token_urlsafe(24)
        return f"{nonce}.{self._sign(nonce)}"

    def valid(self, token: str | None) -> bool:
        if not token or "." not in token:
            return False
        nonce, _, signature = token.partition(".")
        return hmac.compare_digest(signature, self._sign(nonce))

    def matches(self, cookie: str | None, field: str | None) -> bool:
        """Whether a post carries this browser's token: the cookie and the field agree."""
        if not cookie or not field or not self.valid(cookie):
            return False
        return hmac.compare_digest(cookie.encode(), field.encode())

    def _sign(self, nonce: str) -> str:
        return hmac.new(self._secret, nonce.encode(), hashlib.sha256).hexdigest()


class Sessions(CsrfTokens):
    """Logins the token link started: a signed nonce per browser, in an HttpOnly,
    SameSite=Strict cookie, good while this process runs (under a secret of its own)."""


def same_origin(
    origin: str | None,
    fetch_site: str | None,
    host: str | None,
    allowed: AllowedHosts | None = None,
) -> bool:
    """Whether a state-changing request comes from the dashboard's own pages.

    Browsers say where a request comes from (`Sec-Fetch-Site`, `Origin`): any answer but
    the dashboard's own origin is refused, that is one of the names it answers to
    (`allowed`), else, mounted in an application that checks names itself, the request's
    own `Host`. A client that sends neither (curl, a script) is no browser another site
    could drive, and still needs the token.
    """
    if fetch_site is not None and fetch_site != "same-origin":
        return False
    if origin is not None:
        if origin == "null" or not host:
            return False
        if allowed is not None:
            return allowed.allows_origin(origin)
        return urlsplit(origin).netloc.lower() == host.lower()
    return True


class Throttle:
    """Failed logins per client address, in this process's memory: after `most` failures
    within `window` seconds, a client is refused (429) until the oldest of them is
    `window` seconds old, whatever it sends, the right password too, so that guessing goes
    no faster. Another process (another host, a restart) counts its own."""

    def __init__(
        self,
        most: int = 10,
        window: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        tracked: int = 10_000,
    ) -> None:
        self.most, self.window, self._clock, self._tracked = most, window, clock, tracked
        # Oldest failure first per client; clients by their latest failure, so that the
        # one forgotten when too many are tracked is the one quiet for longest.
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def wait(self, client: str) -> int:
        """Whole seconds before `client` may try again: 0 when it may now."""
        failures = self._failures.get(client)
        if failures is None:
            return 0
        now = self._clock()
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        if not failures:
            del self._failures[client]
            return 0
        if len(failures) < self.most:
            return 0
        return max(1, math.ceil(failures[0] + self.window - now))

    def failed(self, client: str) -> None:
        failures = self._failures.setdefault(client, deque(maxlen=self.most))
        failures.append(self._clock())
        self._failures.move_to_end(client)
        while len(self._failures) > self._tracked:
            self._failures.popitem(last=False)


def token_matches(given: str | None, token: str) -> bool:
    """Whether a login link carries the dashboard's token, compared in constant time."""
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def is_loopback(host: str) -> bool:
    """Whether binding to `host` keeps the dashboard on this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def logged_in(scope: dict[str, Any]) -> str | None:
    """Who a request proves to be, for an action: the basic authentication user, the host
    application's authenticated user, or "" for a session of the login link (whose actor is
    the dashboard's --actor: who started it, and saw the link); None for nobody."""
    user = scope.get("jobrunner.user")
    if user is not None:
        return str(user)
    host_user = scope.get("user")
    if host_user is not None and getattr(host_user, "is_authenticated", False):
        return str(getattr(host_user, "display_name", None) or host_user)
    return "" if scope.get("jobrunner.session") else None
