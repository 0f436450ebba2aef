"""The authorization-code flow with PKCE against a real Dex, driven the way a browser would."""

from __future__ import annotations

import base64
from urllib.parse import parse_qs, urlsplit

import pytest

from gpupool.services.oidc import Grant, Identity, LoginRefused, OidcClient, RoleMap, pkce_challenge
from tests.oidc.conftest import log_in
from tests.oidc.dex import Dex


def dex_subject(user_id: str, connector: str) -> str:
    """Dex's `sub`: the protobuf {1: user id, 2: connector id}, base64url without padding."""
    u, c = user_id.encode(), connector.encode()
    raw = b"\x0a" + bytes([len(u)]) + u + b"\x12" + bytes([len(c)]) + c
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def test_discovery_names_the_endpoints_under_the_issuer(web: OidcClient, dex: Dex) -> None:
    meta = web.discover()
    assert meta.issuer == dex.issuer
    assert meta.authorization_endpoint == f"{dex.issuer}/auth"
    assert meta.token_endpoint == f"{dex.issuer}/token"
    assert meta.jwks_uri == f"{dex.issuer}/keys"
    assert meta.device_authorization_endpoint == f"{dex.issuer}/device/code"
    assert "client_secret_basic" in meta.token_endpoint_auth_methods


def test_begin_login_asks_for_a_code_with_s256_pkce_state_and_nonce(web: OidcClient) -> None:
    start = web.begin_login()
    q = {k: v[0] for k, v in parse_qs(urlsplit(start.authorize_url).query).items()}
    assert q["response_type"] == "code" and q["client_id"] == "gpupool"
    assert q["scope"] == "openid email profile groups"
    assert q["state"] == start.state and q["nonce"] == start.nonce
    assert q["code_challenge_method"] == "S256" and q["code_challenge"] == pkce_challenge(start.code_verifier)
    assert len({start.state, start.nonce, start.code_verifier}) == 3
    assert start.state != web.begin_login().state  # fresh each time


def test_a_password_login_yields_the_identity_with_groups(web: OidcClient, dex: Dex) -> None:
    cb = log_in(web, dex, email="alice@example.com")
    who = web.finish_login(cb.code, cb.state, cb.start.state, cb.start.nonce, cb.start.code_verifier)
    assert who == Identity(
        issuer=dex.issuer,
        subject=dex_subject("alice-0001", "local"),
        email="alice@example.com",
        email_verified=True,
        name="Alice Example",
        groups=("ml-admins", "vision-team"),
    )
    roles = RoleMap.parse(["ml-admins=admin", "vision-team=project:vision:member", "auditors=project:vision:viewer"])
    assert roles.grants(who.groups) == [Grant("admin", None, "admin"), Grant("project", "vision", "member")]


def test_dex_mock_callback_connector_returns_its_fixed_identity(web: OidcClient, dex: Dex) -> None:
    cb = log_in(web, dex, connector="mock")
    who = web.finish_login(cb.code, cb.state, cb.start.state, cb.start.nonce, cb.start.code_verifier)
    assert who.subject == dex_subject("0-385-28089-0", "mock")
    assert (who.email, who.name, who.groups) == ("kilgore@kilgore.trout", "Kilgore Trout", ("authors",))
    assert RoleMap.parse(["ml-admins=admin"]).grants(who.groups) == []  # not mapped: no role


def test_the_code_needs_this_login_s_pkce_verifier(web: OidcClient, dex: Dex) -> None:
    cb = log_in(web, dex, connector="mock")
    other_verifier = web.begin_login().code_verifier
    with pytest.raises(LoginRefused) as e:
        web.finish_login(cb.code, cb.state, cb.start.state, cb.start.nonce, other_verifier)
    assert e.value.reason == "grant"


def test_a_code_is_redeemed_once(web: OidcClient, dex: Dex) -> None:
    cb = log_in(web, dex, connector="mock")
    web.finish_login(cb.code, cb.state, cb.start.state, cb.start.nonce, cb.start.code_verifier)
    with pytest.raises(LoginRefused) as e:
        web.finish_login(cb.code, cb.state, cb.start.state, cb.start.nonce, cb.start.code_verifier)
    assert e.value.reason == "grant"
