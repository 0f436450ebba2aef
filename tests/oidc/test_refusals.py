"""Every way a login is refused, each with real tokens from a real Dex (altered where the test says so)."""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx
import jwt
import pytest

from gpupool.services.oidc import LoginRefused, OidcClient, OidcConfig, ProviderError
from tests.oidc.conftest import client_for, log_in
from tests.oidc.dex import OTHER_CLIENT, OTHER_REDIRECT, OTHER_SECRET, REDIRECT, WEB_CLIENT, WEB_SECRET, Dex


def _b64d(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def _b64e(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _id_token(client: OidcClient, dex: Dex, **login: Any) -> tuple[str, str]:
    """A real ID token for this client, and the nonce its login used."""
    cb = log_in(client, dex, **login)
    tokens = client.exchange_code(cb.code, cb.start.code_verifier)
    return tokens["id_token"], cb.start.nonce


def _refused(reason: str, call: Callable[[], object]) -> LoginRefused:
    with pytest.raises(LoginRefused) as e:
        call()
    assert e.value.reason == reason, str(e.value)
    return e.value


def test_the_untouched_token_verifies(web: OidcClient, dex: Dex) -> None:
    token, nonce = _id_token(web, dex, email="alice@example.com")
    claims = web.verify_id_token(token, nonce=nonce)
    assert claims["iss"] == dex.issuer and claims["aud"] == WEB_CLIENT and claims["email"] == "alice@example.com"


def test_a_token_with_one_changed_payload_byte_is_refused(web: OidcClient, dex: Dex) -> None:
    token, nonce = _id_token(web, dex, email="alice@example.com")
    head, payload, sig = token.split(".")
    raw = _b64d(payload)
    assert raw.count(b"alice@") == 1
    tampered = _b64e(raw.replace(b"alice@", b"alicf@"))  # one byte: another person's email
    _refused("signature", lambda: web.verify_id_token(f"{head}.{tampered}.{sig}", nonce=nonce))


def test_a_token_for_another_client_is_refused(web: OidcClient, dex: Dex) -> None:
    with client_for(dex, OTHER_CLIENT, OTHER_SECRET, redirect_uri=OTHER_REDIRECT) as other:
        token, nonce = _id_token(other, dex, connector="mock")
        assert other.verify_id_token(token, nonce=nonce)["aud"] == OTHER_CLIENT  # good for the client it names
    _refused("audience", lambda: web.verify_id_token(token, nonce=nonce))


def test_an_expired_token_and_one_from_the_future_are_refused(web: OidcClient, dex: Dex) -> None:
    token, nonce = _id_token(web, dex, connector="mock")
    exp = web.verify_id_token(token, nonce=nonce)["exp"]
    web.verify_id_token(token, nonce=nonce, now=exp + 59)  # within the 60 s leeway
    _refused("expired", lambda: web.verify_id_token(token, nonce=nonce, now=exp + 61))
    _refused("expired", lambda: web.verify_id_token(token, nonce=nonce, now=time.time() + 2 * 86400))
    _refused("not_yet_valid", lambda: web.verify_id_token(token, nonce=nonce, now=time.time() - 3600))
    cfg = OidcConfig(dex.issuer, WEB_CLIENT, WEB_SECRET, REDIRECT)
    with OidcClient(cfg, clock=lambda: time.time() + 2 * 86400) as late:  # the clock the client was given
        _refused("expired", lambda: late.verify_id_token(token, nonce=nonce))


def test_a_wrong_nonce_is_refused(web: OidcClient, dex: Dex) -> None:
    cb = log_in(web, dex, connector="mock")
    other_nonce = web.begin_login().nonce
    _refused("nonce", lambda: web.finish_login(cb.code, cb.state, cb.start.state, other_nonce, cb.start.code_verifier))


def test_a_wrong_state_is_refused_before_the_code_is_spent(web: OidcClient, dex: Dex) -> None:
    cb = log_in(web, dex, connector="mock")
    other_state = web.begin_login().state
    s = cb.start
    _refused("state", lambda: web.finish_login(cb.code, cb.state, other_state, s.nonce, s.code_verifier))
    _refused("state", lambda: web.finish_login(cb.code, "", "", s.nonce, s.code_verifier))
    assert web.finish_login(cb.code, cb.state, s.state, s.nonce, s.code_verifier).groups == ("authors",)


def test_an_unverified_email_is_refused(web: OidcClient, dex: Dex) -> None:
    cb = log_in(web, dex, email="bob@example.com")  # Dex: emailVerified false for bob
    s = cb.start
    _refused("email_unverified", lambda: web.finish_login(cb.code, cb.state, s.state, s.nonce, s.code_verifier))


def test_unsigned_and_hmac_tokens_are_refused(web: OidcClient, dex: Dex) -> None:
    token, nonce = _id_token(web, dex, connector="mock")
    header = jwt.get_unverified_header(token)
    claims = json.loads(_b64d(token.split(".")[1]))
    unsigned = f"{_b64e(json.dumps({'alg': 'none', 'kid': header['kid']}).encode())}.{token.split('.')[1]}."
    _refused("algorithm", lambda: web.verify_id_token(unsigned, nonce=nonce))
    hmac_token = jwt.encode(claims, WEB_SECRET, algorithm="HS256", headers={"kid": header["kid"]})
    _refused("algorithm", lambda: web.verify_id_token(hmac_token, nonce=nonce))
    _refused("malformed", lambda: web.verify_id_token("not.a-jwt", nonce=nonce))


def test_an_unknown_kid_refetches_the_keys_once_then_is_refused(dex: Dex) -> None:
    fetched: list[str] = []
    http = httpx.Client(event_hooks={"request": [lambda r: fetched.append(r.url.path)]})
    cfg = OidcConfig(dex.issuer, WEB_CLIENT, WEB_SECRET, REDIRECT)
    now = [time.time()]
    with http, OidcClient(cfg, http=http, clock=lambda: now[0], jwks_refetch_after_s=10) as c:
        token, nonce = _id_token(c, dex, connector="mock")
        c.verify_id_token(token, nonce=nonce)
        c.verify_id_token(token, nonce=nonce)
        assert fetched.count("/dex/keys") == 1  # cached
        _, payload, sig = token.split(".")
        other = _b64e(json.dumps({**jwt.get_unverified_header(token), "kid": "rotated-away"}).encode())
        _refused("unknown_key", lambda: c.verify_id_token(f"{other}.{payload}.{sig}", nonce=nonce))
        assert fetched.count("/dex/keys") == 2  # refetched once, for a rotation
        _refused("unknown_key", lambda: c.verify_id_token(f"{other}.{payload}.{sig}", nonce=nonce))
        assert fetched.count("/dex/keys") == 2  # not again so soon: unknown kids cannot make it hammer the IdP
        now[0] += 11
        _refused("unknown_key", lambda: c.verify_id_token(f"{other}.{payload}.{sig}", nonce=nonce))
        assert fetched.count("/dex/keys") == 3  # later, once more
        c.verify_id_token(token, nonce=nonce)
        assert fetched.count("/dex/keys") == 3  # a known kid never refetches


def test_a_token_from_another_issuer_with_the_same_keys_is_refused(start_dex: Callable[..., Dex], postgres) -> None:
    # Two real Dex instances, two issuers, one storage: the same signing keys and the same user. A token that
    # verifies with the right key but names the other issuer must still be refused (the mix-up, and the
    # "same email, another IdP" takeover).
    db = urlsplit(postgres.new_database()).path.lstrip("/")
    storage = {
        "type": "postgres",
        "config": {
            "host": "127.0.0.1",
            "port": postgres.port,
            "database": db,
            "user": "postgres",
            "ssl": {"mode": "disable"},
        },
    }
    a = start_dex(storage=storage)
    b = start_dex(storage=storage)
    with client_for(a) as at_a, client_for(b) as at_b:
        keys_a = httpx.get(at_a.discover().jwks_uri).json()["keys"]
        keys_b = httpx.get(at_b.discover().jwks_uri).json()["keys"]
        assert {k["kid"] for k in keys_a} == {k["kid"] for k in keys_b}  # the precondition: shared keys
        token, nonce = _id_token(at_a, a, email="alice@example.com")
        assert at_a.verify_id_token(token, nonce=nonce)["iss"] == a.issuer
        _refused("issuer", lambda: at_b.verify_id_token(token, nonce=nonce))


def test_discovery_must_name_exactly_the_configured_issuer(dex: Dex) -> None:
    same_server = dex.issuer.replace("127.0.0.1", "localhost")
    cfg = OidcConfig(same_server, WEB_CLIENT, WEB_SECRET, REDIRECT)
    with OidcClient(cfg) as c, pytest.raises(ProviderError, match="names the issuer"):
        c.discover()


def test_every_provider_call_has_a_size_limit_and_a_timeout(dex: Dex) -> None:
    with client_for(dex, max_response_bytes=200) as small, pytest.raises(ProviderError, match="over 200 bytes"):
        small.discover()
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        issuer = f"http://127.0.0.1:{silent.getsockname()[1]}/dex"
        cfg = OidcConfig(issuer, WEB_CLIENT, WEB_SECRET, REDIRECT, http_timeout_s=0.5)
        started = time.monotonic()
        with OidcClient(cfg) as c, pytest.raises(ProviderError, match="Timeout"):
            c.discover()
        assert time.monotonic() - started < 5
