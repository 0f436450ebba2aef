"""The device flow (RFC 8628) against a real Dex: the CLI's login. A person approves it in a browser."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from gpupool.services.oidc import DeviceSlowDown, LoginRefused
from tests.oidc.conftest import client_for
from tests.oidc.dex import CLI_CLIENT, Browser, Dex


def _approve(dex: Dex, url: str, **person: Any) -> str:
    """A person opens the verification URL, confirms the code, logs in and approves; the last page's text."""
    browser = Browser(dex.issuer, **person)
    try:
        browser.go(url)
        return browser.pages[-1]
    finally:
        browser.close()


def test_begin_device_gives_a_code_to_show_and_a_url_to_open(dex: Dex) -> None:
    with client_for(dex, CLI_CLIENT, None, redirect_uri="") as cli:
        device = cli.begin_device()
    assert device.verification_uri == f"{dex.issuer}/device"
    assert device.verification_uri_complete == f"{dex.issuer}/device?user_code={device.user_code}"
    assert len(device.user_code) == 9 and device.user_code[4] == "-"
    assert (device.interval, device.expires_in) == (5, 300)
    assert device.code_verifier and device.device_code


def test_the_device_flow_yields_the_identity_once_approved(dex: Dex) -> None:
    with client_for(dex, CLI_CLIENT, None, redirect_uri="") as cli:
        device = cli.begin_device()
        assert cli.poll_device(device.device_code, device.code_verifier) is None  # pending
        with pytest.raises(DeviceSlowDown):  # polled again at once: Dex asks for 5 s more
            cli.poll_device(device.device_code, device.code_verifier)
        page = _approve(
            dex, device.verification_uri, connector="local", email="alice@example.com", user_code=device.user_code
        )
        assert "Login Successful" in page
        with pytest.raises(LoginRefused) as e:  # the device code is bound to this login's PKCE verifier
            cli.poll_device(device.device_code, cli.begin_device().code_verifier)
        assert e.value.reason == "grant"
        who = cli.poll_device(device.device_code, device.code_verifier)
    assert who is not None
    assert (who.issuer, who.email, who.groups) == (dex.issuer, "alice@example.com", ("ml-admins", "vision-team"))


def test_wait_device_polls_at_the_interval_until_approved(dex: Dex) -> None:
    slept: list[float] = []
    with client_for(dex, CLI_CLIENT, None, redirect_uri="") as cli:
        device = cli.begin_device()

        def sleep(seconds: float) -> None:  # the person approves while the CLI waits its first interval
            slept.append(seconds)
            if len(slept) == 1:
                _approve(dex, device.verification_uri_complete or "", connector="mock")

        who = cli.wait_device(device, sleep=sleep)
    assert slept == [5] and who.groups == ("authors",)


def test_an_expired_device_code_is_refused(start_dex: Callable[..., Dex]) -> None:
    short = start_dex(expiry={"deviceRequests": "1s"})
    with client_for(short, CLI_CLIENT, None, redirect_uri="") as cli:
        device = cli.begin_device()
        assert device.expires_in == 1
        deadline = time.monotonic() + 20
        while True:  # poll until Dex itself says the code expired
            try:
                assert cli.poll_device(device.device_code, device.code_verifier) is None
            except DeviceSlowDown:
                pass
            except LoginRefused as e:
                assert e.reason == "device_expired"
                break
            assert time.monotonic() < deadline, "Dex never said the device code expired"
            time.sleep(0.25)  # a poll's pace: the loop ends on Dex's answer
        # the person arrives too late: Dex's page says the code is invalid, and nothing is approved
        page = _approve(short, device.verification_uri_complete or "", connector="mock")
        assert "Invalid or Expired User Code" in page and "Login Successful" not in page
