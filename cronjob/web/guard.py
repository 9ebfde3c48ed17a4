"""Who may reach the dashboard and what a request may do: basic authentication, the
cross-site request forgery token, the same-origin check, and the headers every response
carries.

Pure functions over header values and secrets, imported by the ASGI layer
(`cronjob.web.application`), which applies them to every request before any page runs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

# Nothing stored can run script or load anything: no script source at all, styles and images
# from the dashboard itself (charts are inline SVG, which is markup, not a resource), forms
# that post back to it alone, and no page may frame it. The referrer goes to the dashboard
# alone: with none at all, a browser posts its forms as from an opaque origin ("null").
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
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


def same_origin(origin: str | None, fetch_site: str | None, host: str | None) -> bool:
    """Whether a state-changing request comes from the dashboard's own pages.

    Browsers say where a request comes from (`Sec-Fetch-Site`, `Origin`): any answer but
    the dashboard's own origin is refused. A client that sends neither (curl, a script)
    is no browser another site could drive, and still needs the token.
    """
    if fetch_site is not None and fetch_site != "same-origin":
        return False
    if origin is not None:
        if origin == "null" or not host:
            return False
        return urlsplit(origin).netloc.lower() == host.lower()
    return True


def is_loopback(host: str) -> bool:
    """Whether binding to `host` keeps the dashboard on this machine."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
