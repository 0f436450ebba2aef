"""The values and errors of single sign-on with OpenID Connect (the flows are in gpupool.services.oidc)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Literal, NamedTuple
from urllib.parse import urlsplit

SUPPORTED_ALGORITHMS = ("RS256", "ES256")
"""The only ID-token signatures accepted: never `none`, never HS* (whose key would be the client secret)."""

Reason = Literal[
    "state",  # the state returned to the callback is not the one this login began with
    "nonce",  # the ID token's nonce is not this login's
    "malformed",  # not a JWT, or a claim missing or of the wrong type
    "algorithm",  # signed with an algorithm outside the allow-list
    "unknown_key",  # no key of the provider's JWKS has the token's kid, even after one refetch
    "signature",  # the signature does not verify: tampered, or signed by someone else
    "issuer",  # `iss` is not exactly the configured issuer
    "audience",  # not issued to this client (`aud` lacks client_id, or `azp` names another)
    "expired",  # past `exp` (beyond the leeway)
    "not_yet_valid",  # `iat` or `nbf` in the future (beyond the leeway)
    "email_unverified",  # `email_verified` is not true: an unverified email could take over an account
    "grant",  # the token endpoint refused the code or device code (reused, wrong verifier, revoked...)
    "device_expired",  # the device code expired before the user approved it
    "device_denied",  # the user denied the device
]


class OidcError(Exception):
    """Anything this module refuses or cannot do."""


class ProviderError(OidcError):
    """The provider cannot be reached or answered something unusable (a 502, not the user's fault)."""


class LoginRefused(OidcError):
    """This login is refused; `reason` says why (one of `Reason`), the message says more for the logs."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason: Reason = reason


class DeviceSlowDown(OidcError):  # named after RFC 8628's slow_down, which is no error
    """The provider asked the device flow to poll less often: add 5 seconds to the interval from now on."""

    increase = 5


def _is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_url(url: str, what: str) -> str:
    """https only, except plain http to a loopback address (a provider on the same machine, as in the tests)."""
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return url
    if parts.scheme == "http" and _is_loopback(parts.hostname):
        return url
    raise ValueError(f"{what} must be an https URL (or http to a loopback address), not {url[:200]!r}")


@dataclass(frozen=True, slots=True)
class OidcConfig:
    issuer: str
    client_id: str
    client_secret: str | None  # None for a public client (PKCE alone, as a CLI would be)
    redirect_uri: str
    scopes: str = "openid email profile groups"
    groups_claim: str = "groups"
    algorithms: tuple[str, ...] = SUPPORTED_ALGORITHMS
    leeway_s: float = 60.0
    http_timeout_s: float = 10.0
    max_response_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        check_url(self.issuer, "the issuer")
        if urlsplit(self.issuer).query or urlsplit(self.issuer).fragment:
            raise ValueError("the issuer URL has no query or fragment")
        if self.redirect_uri:
            check_url(self.redirect_uri, "the redirect URI")
        if not self.client_id:
            raise ValueError("client_id is empty")
        if "openid" not in self.scopes.split():
            raise ValueError(f"the scopes {self.scopes!r} lack 'openid'")
        if not self.algorithms or not set(self.algorithms) <= set(SUPPORTED_ALGORITHMS):
            raise ValueError(f"algorithms must be a non-empty subset of {SUPPORTED_ALGORITHMS}")

    @property
    def allowed_issuer(self) -> str:
        """The one issuer whose tokens are accepted: the configured one, compared as an exact string."""
        return self.issuer


@dataclass(frozen=True, slots=True)
class Identity:
    issuer: str
    subject: str
    email: str
    email_verified: bool
    name: str | None
    groups: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ProviderMetadata:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    device_authorization_endpoint: str | None
    token_endpoint_auth_methods: tuple[str, ...]


class LoginStart(NamedTuple):
    authorize_url: str
    state: str
    nonce: str
    code_verifier: str


@dataclass(frozen=True, slots=True)
class DeviceAuthorization:
    """What `begin_device` got: show `user_code` and `verification_uri` to the person; keep `device_code` and
    `code_verifier` to poll with, every `interval` seconds (more after a `DeviceSlowDown`), for `expires_in`."""

    device_code: str
    user_code: str
    verification_uri: str
    interval: int
    expires_in: int
    verification_uri_complete: str | None = None
    code_verifier: str | None = field(default=None, repr=False)
