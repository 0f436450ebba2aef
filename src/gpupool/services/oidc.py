"""Single sign-on with an OpenID Connect provider: discovery, the authorization-code flow with PKCE, the device
flow (RFC 8628), ID-token verification and the mapping of the provider's groups to gpupool roles.

Nothing here is global and nothing is kept between a login's two halves: `begin_login` hands the caller the
state, nonce and PKCE verifier to keep (a signed, short-lived cookie, say) and `finish_login` takes them back.
The only state an `OidcClient` holds is a cache of the provider's metadata and keys. Every refusal a user's login
can meet is a `LoginRefused` with a `reason`; a provider that cannot be reached or answers nonsense is a
`ProviderError`. Identity is (issuer, subject), never the email, and an unverified email is refused outright.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NoReturn
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import httpx
import jwt

from gpupool.services.oidc_model import (
    SUPPORTED_ALGORITHMS,
    DeviceAuthorization,
    DeviceSlowDown,
    Identity,
    LoginRefused,
    LoginStart,
    OidcConfig,
    OidcError,
    ProviderError,
    ProviderMetadata,
    Reason,
    check_url,
)
from gpupool.services.oidc_roles import ROLES, Grant, RoleMap, parse_role_entry

__all__ = [
    "ROLES",
    "SUPPORTED_ALGORITHMS",
    "DeviceAuthorization",
    "DeviceSlowDown",
    "Grant",
    "Identity",
    "LoginRefused",
    "LoginStart",
    "OidcClient",
    "OidcConfig",
    "OidcError",
    "ProviderError",
    "ProviderMetadata",
    "Reason",
    "RoleMap",
    "parse_role_entry",
    "pkce_challenge",
]

_KEY_TYPES = {"RS256": ("RSA", None), "ES256": ("EC", "P-256")}
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def pkce_challenge(verifier: str) -> str:
    return _b64url(hashlib.sha256(verifier.encode("ascii")).digest())


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


class OidcClient:
    """One provider. Thread-safe; `http` (an httpx.Client) and `clock` (Unix seconds) can be injected."""

    def __init__(
        self,
        config: OidcConfig,
        *,
        http: httpx.Client | None = None,
        clock: Callable[[], float] = time.time,
        jwks_refetch_after_s: float = 10.0,
    ) -> None:
        self.config = config
        self._own_http = http is None
        self._http = http or httpx.Client(timeout=config.http_timeout_s, follow_redirects=False)
        self._clock = clock
        self._refetch_after = jwks_refetch_after_s
        self._lock = threading.Lock()
        self._metadata: ProviderMetadata | None = None
        self._jwks: list[tuple[dict[str, Any], jwt.PyJWK]] | None = None
        self._jwks_refetched_at = float("-inf")

    def close(self) -> None:
        if self._own_http:
            self._http.close()

    def __enter__(self) -> OidcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- HTTP: a timeout, no redirects and a size limit on every call ---

    def _call(self, method: str, url: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        limit = self.config.max_response_bytes
        try:
            with self._http.stream(
                method, url, timeout=self.config.http_timeout_s, follow_redirects=False, **kwargs
            ) as r:
                if int(r.headers.get("content-length") or 0) > limit:
                    raise ProviderError(f"{url}: answer over {limit} bytes")
                body = bytearray()
                for chunk in r.iter_bytes():
                    body += chunk
                    if len(body) > limit:
                        raise ProviderError(f"{url}: answer over {limit} bytes")
                status = r.status_code
        except httpx.HTTPError as e:
            raise ProviderError(f"{url}: {type(e).__name__}: {e}") from e
        try:
            data = json.loads(body)
        except ValueError:
            raise ProviderError(f"{url}: HTTP {status}, not JSON: {bytes(body[:200])!r}") from None
        if not isinstance(data, dict):
            raise ProviderError(f"{url}: HTTP {status}, a JSON {type(data).__name__}, not an object")
        return status, data

    def _get(self, url: str) -> dict[str, Any]:
        status, data = self._call("GET", url, headers={"Accept": "application/json"})
        if status != 200:
            raise ProviderError(f"{url}: HTTP {status}")
        return data

    def _token_request(self, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        meta = self.discover()
        headers = {"Accept": "application/json"}
        cfg = self.config
        if cfg.client_secret is None:
            form = {**form, "client_id": cfg.client_id}
        elif "client_secret_basic" in meta.token_endpoint_auth_methods:
            pair = f"{quote(cfg.client_id, safe='')}:{quote(cfg.client_secret, safe='')}"  # RFC 6749 2.3.1
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        else:
            form = {**form, "client_id": cfg.client_id, "client_secret": cfg.client_secret}
        return self._call("POST", meta.token_endpoint, data=form, headers=headers)

    # --- discovery and keys ---

    def discover(self) -> ProviderMetadata:
        """The provider's metadata, fetched once; its `issuer` must be exactly the configured one."""
        with self._lock:
            if self._metadata is not None:
                return self._metadata
        url = self.config.issuer.rstrip("/") + "/.well-known/openid-configuration"
        doc = self._get(url)
        if doc.get("issuer") != self.config.issuer:
            raise ProviderError(f"{url} names the issuer {str(doc.get('issuer'))[:200]!r}, not {self.config.issuer!r}")

        def endpoint(name: str) -> str | None:
            value = doc.get(name)
            if value is None:
                return None
            try:
                return check_url(_text(value), name)
            except ValueError as e:
                raise ProviderError(f"{url}: {name}: {e}") from None

        authorize, token, jwks = (endpoint(n) for n in ("authorization_endpoint", "token_endpoint", "jwks_uri"))
        if authorize is None or token is None or jwks is None:
            raise ProviderError(f"{url} lacks the authorization, token or JWKS endpoint")
        methods = doc.get("token_endpoint_auth_methods_supported")
        if not isinstance(methods, list) or not methods:
            methods = ["client_secret_basic"]  # the default OpenID Connect Discovery names
        meta = ProviderMetadata(
            issuer=self.config.issuer,
            authorization_endpoint=authorize,
            token_endpoint=token,
            jwks_uri=jwks,
            device_authorization_endpoint=endpoint("device_authorization_endpoint"),
            token_endpoint_auth_methods=tuple(m for m in methods if isinstance(m, str)),
        )
        with self._lock:
            self._metadata = meta
        return meta

    def _keys(self, refresh: bool) -> list[tuple[dict[str, Any], jwt.PyJWK]]:
        """The provider's keys, fetched once; `refresh` (an unknown kid: a rotation?) fetches them again, at
        most once per `jwks_refetch_after_s`, so that tokens with made-up kids cannot make it hammer the IdP."""
        with self._lock:
            if self._jwks is not None and not refresh:
                return self._jwks
            if self._jwks is not None and self._clock() - self._jwks_refetched_at < self._refetch_after:
                return self._jwks
            if refresh:
                self._jwks_refetched_at = self._clock()
        doc = self._get(self.discover().jwks_uri)
        raw = doc.get("keys")
        if not isinstance(raw, list):
            raise ProviderError("the provider's JWKS has no list of keys")
        keys = []
        for k in raw:
            if isinstance(k, dict) and k.get("kty") in ("RSA", "EC"):
                try:
                    keys.append((k, jwt.PyJWK(k)))
                except jwt.PyJWTError:
                    continue  # a key this module cannot use (an unknown curve, say) verifies nothing here
        with self._lock:
            self._jwks = keys
        return keys

    def _key_for(self, header: Mapping[str, Any]) -> jwt.PyJWK:
        alg, kid = header.get("alg"), header.get("kid")
        kty, crv = _KEY_TYPES[str(alg)]

        def pick(keys: list[tuple[dict[str, Any], jwt.PyJWK]]) -> jwt.PyJWK | None:
            for data, k in keys:
                if kid is not None and data.get("kid") != kid:
                    continue
                if data.get("kty") != kty or (crv is not None and data.get("crv") != crv):
                    continue
                if data.get("alg") not in (None, alg) or data.get("use") not in (None, "sig"):
                    continue
                return k
            return None

        found = pick(self._keys(refresh=False)) or pick(self._keys(refresh=True))  # refetch once: a rotation
        if found is None:
            raise LoginRefused("unknown_key", f"no {alg} key with kid {str(kid)[:80]!r} in the provider's JWKS")
        return found

    # --- ID tokens ---

    def verify_id_token(self, token: str, *, nonce: str | None, now: float | None = None) -> dict[str, Any]:
        """The token's claims once its signature, issuer, audience, times and nonce check out. `nonce=None`
        only where the flow sent none (the device flow); `now` (Unix seconds) defaults to the client's clock."""
        cfg = self.config
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as e:
            raise LoginRefused("malformed", f"not a signed JWT: {e}") from None
        alg = header.get("alg")
        if alg not in cfg.algorithms:
            raise LoginRefused("algorithm", f"signed with {str(alg)[:20]!r}, not one of {cfg.algorithms}")
        key = self._key_for(header)
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key=key,
                algorithms=[str(alg)],
                audience=cfg.client_id,
                issuer=cfg.issuer,
                options={
                    "verify_exp": False,  # the times are checked below, against the injectable clock
                    "verify_iat": False,
                    "verify_nbf": False,
                    "require": ["iss", "sub", "aud", "exp", "iat"],
                },
            )
        except jwt.InvalidSignatureError:
            raise LoginRefused("signature", "the signature does not verify") from None
        except jwt.InvalidIssuerError:
            raise LoginRefused("issuer", f"not issued by {cfg.issuer!r}") from None
        except jwt.InvalidAudienceError:
            raise LoginRefused("audience", f"not issued to {cfg.client_id!r}") from None
        except jwt.PyJWTError as e:
            raise LoginRefused("malformed", str(e)[:200]) from None
        if claims["iss"] != cfg.allowed_issuer:  # what PyJWT checked, said again where it matters most
            raise LoginRefused("issuer", f"not issued by {cfg.issuer!r}")
        aud = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        azp = claims.get("azp")
        if (len(aud) > 1 or azp is not None) and azp != cfg.client_id:
            raise LoginRefused("audience", f"authorized party {str(azp)[:80]!r} is not {cfg.client_id!r}")
        self._check_times(claims, self._clock() if now is None else now)
        if nonce is not None:
            got = claims.get("nonce")
            if not isinstance(got, str) or not _same(got, nonce):
                raise LoginRefused("nonce", "the ID token's nonce is not this login's")
        return claims

    def _check_times(self, claims: Mapping[str, Any], now: float) -> None:
        leeway = self.config.leeway_s
        for name in ("exp", "iat", "nbf"):
            if name in claims and (not isinstance(claims[name], int | float) or isinstance(claims[name], bool)):
                raise LoginRefused("malformed", f"{name} is not a number")
        if now > claims["exp"] + leeway:
            raise LoginRefused("expired", f"expired {now - claims['exp']:.0f} s ago")
        if claims["iat"] > now + leeway or claims.get("nbf", now) > now + leeway:
            raise LoginRefused("not_yet_valid", "issued for the future: is a clock wrong?")

    def identity(self, claims: Mapping[str, Any]) -> Identity:
        """The person verified claims name. Refuses an email the provider has not verified."""
        if claims.get("email_verified") is not True:
            raise LoginRefused("email_unverified", "the provider has not verified this email address")
        email, sub, name = claims.get("email"), claims.get("sub"), claims.get("name")
        groups = claims.get(self.config.groups_claim, [])
        if not isinstance(email, str) or not email or not isinstance(sub, str) or not sub:
            raise LoginRefused("malformed", "the ID token lacks sub or email")
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise LoginRefused("malformed", f"the {self.config.groups_claim!r} claim is not a list of strings")
        return Identity(
            issuer=str(claims["iss"]),
            subject=sub,
            email=email,
            email_verified=True,
            name=name if isinstance(name, str) else None,
            groups=tuple(groups),
        )

    def _identity_from_tokens(self, tokens: Mapping[str, Any], nonce: str | None) -> Identity:
        id_token = tokens.get("id_token")
        if not isinstance(id_token, str):
            raise ProviderError("the token endpoint answered without an id_token")
        return self.identity(self.verify_id_token(id_token, nonce=nonce))

    # --- the authorization-code flow with PKCE ---

    def begin_login(self, redirect_uri: str | None = None) -> LoginStart:
        """Where to send the browser, and the state, nonce and PKCE verifier for the caller to keep."""
        meta = self.discover()
        state, nonce, verifier = secrets.token_urlsafe(32), secrets.token_urlsafe(32), secrets.token_urlsafe(64)
        params = {
            "response_type": "code",
            "client_id": self.config.client_id,
            "redirect_uri": redirect_uri or self.config.redirect_uri,
            "scope": self.config.scopes,
            "state": state,
            "nonce": nonce,
            "code_challenge": pkce_challenge(verifier),
            "code_challenge_method": "S256",
        }
        parts = urlsplit(meta.authorization_endpoint)
        query = urlencode([*parse_qsl(parts.query), *params.items()])
        return LoginStart(urlunsplit(parts._replace(query=query)), state, nonce, verifier)

    def finish_login(
        self,
        code: str,
        state: str,
        expected_state: str,
        nonce: str,
        code_verifier: str,
        redirect_uri: str | None = None,
    ) -> Identity:
        """The callback's half: check `state`, redeem `code` with the verifier, verify the ID token."""
        if not expected_state or not state or not _same(state, expected_state):
            raise LoginRefused("state", "the callback's state is not this login's")
        return self._identity_from_tokens(self.exchange_code(code, code_verifier, redirect_uri), nonce)

    def exchange_code(self, code: str, code_verifier: str, redirect_uri: str | None = None) -> dict[str, Any]:
        """Redeem an authorization code at the token endpoint: the provider's answer, its tokens unverified.
        `finish_login` is this plus the state and ID-token checks; use it, unless the raw tokens are needed."""
        status, tokens = self._token_request(
            {
                "grant_type": "authorization_code",
                "code": code,
                "redirect_uri": redirect_uri or self.config.redirect_uri,
                "code_verifier": code_verifier,
            }
        )
        if status != 200:
            self._token_failure(status, tokens)
        return tokens

    def _token_failure(self, status: int, body: Mapping[str, Any]) -> NoReturn:
        error = str(body.get("error", ""))[:80]
        detail = str(body.get("error_description", ""))[:200]
        if 400 <= status < 500 and error:
            raise LoginRefused("grant", f"{error}: {detail}" if detail else error)
        raise ProviderError(f"the token endpoint answered HTTP {status} {error}")

    # --- the device flow (RFC 8628), with PKCE where the provider takes it ---

    def begin_device(self) -> DeviceAuthorization:
        meta = self.discover()
        if meta.device_authorization_endpoint is None:
            raise ProviderError("the provider offers no device authorization endpoint")
        verifier = secrets.token_urlsafe(64)
        form = {
            "client_id": self.config.client_id,
            "scope": self.config.scopes,
            "code_challenge": pkce_challenge(verifier),
            "code_challenge_method": "S256",
        }
        if self.config.client_secret is not None:
            form["client_secret"] = self.config.client_secret
        status, doc = self._call("POST", meta.device_authorization_endpoint, data=form)
        if status != 200:
            raise ProviderError(f"the device authorization endpoint answered HTTP {status} {doc.get('error')}")
        complete = doc.get("verification_uri_complete")
        try:
            device = DeviceAuthorization(
                device_code=_text(doc["device_code"]),
                user_code=_text(doc["user_code"]),
                verification_uri=check_url(_text(doc["verification_uri"]), "verification_uri"),
                interval=max(1, int(doc.get("interval", 5))),
                expires_in=int(doc["expires_in"]),
                verification_uri_complete=(
                    None if complete is None else check_url(_text(complete), "verification_uri_complete")
                ),
                code_verifier=verifier,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ProviderError(f"the device authorization answer is unusable: {e}") from None
        return device

    def poll_device(self, device_code: str, code_verifier: str | None = None) -> Identity | None:
        """One poll: None while the person has not approved yet; the Identity once they have. Raises
        `DeviceSlowDown` (poll 5 s less often from now on) and `LoginRefused` (expired or denied)."""
        form = {"grant_type": DEVICE_GRANT, "device_code": device_code}
        if code_verifier is not None:
            form["code_verifier"] = code_verifier
        status, body = self._token_request(form)
        if status == 200:
            return self._identity_from_tokens(body, None)
        error = body.get("error")
        if error == "authorization_pending":
            return None
        if error == "slow_down":
            raise DeviceSlowDown("the provider asked to poll less often")
        if error == "expired_token":
            raise LoginRefused("device_expired", "the device code expired before it was approved")
        if error == "access_denied":
            raise LoginRefused("device_denied", "the person denied this device")
        self._token_failure(status, body)

    def wait_device(self, device: DeviceAuthorization, *, sleep: Callable[[float], None] = time.sleep) -> Identity:
        """Poll until approved, honouring the interval and slow_down; refuses once `expires_in` has passed."""
        interval = device.interval
        deadline = time.monotonic() + device.expires_in
        while True:
            try:
                found = self.poll_device(device.device_code, device.code_verifier)
            except DeviceSlowDown:
                interval += DeviceSlowDown.increase
                found = None
            if found is not None:
                return found
            if time.monotonic() + interval > deadline:
                raise LoginRefused("device_expired", "the device code expired before it was approved")
            sleep(interval)


def _text(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r:.80} is not a non-empty string")
    return value
