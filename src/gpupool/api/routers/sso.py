"""Single sign-on with an OpenID Connect provider: the portal's authorization-code flow and the CLI's device
flow. None of these routes takes a token; each answers 404 when the server has no provider configured.

The browser's login keeps its state, nonce and PKCE verifier in a signed, HttpOnly cookie for ten minutes. The
callback hands the new session to the portal in a second one-time cookie (never in a URL), which the portal
trades for the token with `POST /api/v1/sso/session`. A refused login lands on the portal's sign-in page with
a short code (`/#/login?sso_error=no_access`), never the provider's own words.
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Cookie, Depends, Path, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from gpupool.api.deps import Context, ContextDep, SessionDep, no_store, set_session_cookies
from gpupool.api.errors import ERRORS
from gpupool.models.accounts import DevicePending, DeviceStart, LoginResponse, SsoConfig
from gpupool.services import audit
from gpupool.services.oidc import DeviceSlowDown, LoginRefused, ProviderError
from gpupool.services.sso import Refused, Sso, seal, sign_in, unseal

router = APIRouter(prefix="/sso", tags=["sso"], responses=ERRORS)
log = logging.getLogger("gpupool.sso")

LOGIN_COOKIE, HANDOFF_COOKIE = "gpupool_sso_login", "gpupool_sso_session"
COOKIE_PATH = "/api/v1/sso/"
LOGIN_TTL_S, HANDOFF_TTL_S = 600, 60
NOT_CONFIGURED = "single sign-on is not configured"
_REQUEST_ID = re.compile(r"[A-Za-z0-9-]{8,36}")


def _sso(ctx: Context) -> Sso | JSONResponse:
    return ctx.sso if ctx.sso is not None else JSONResponse({"detail": NOT_CONFIGURED}, 404)


def _cookie(response: Response, request: Request, name: str, value: str, max_age: int, path: str) -> None:
    response.set_cookie(
        name, value, max_age=max_age, path=path, httponly=True, samesite="lax",
        secure=request.url.scheme == "https",
    )  # fmt: skip


def _to_portal(code: str) -> RedirectResponse:
    """The sign-in page, with a short code the portal turns into words (never the provider's text)."""
    answer = RedirectResponse(f"/#/login?sso_error={code}", 303)
    answer.delete_cookie(LOGIN_COOKIE, path=COOKIE_PATH)
    return answer


@router.get("/config", response_model=SsoConfig)
def sso_config(ctx: ContextDep) -> SsoConfig:
    """Whether this server offers single sign-on. Needs no token."""
    return SsoConfig(enabled=ctx.sso is not None)


@router.get("/login", status_code=302, response_class=RedirectResponse)
def sso_login(ctx: ContextDep, request: Request) -> Response:
    """Begin a browser's login: off to the provider, with this login's state kept in a signed cookie."""
    sso = _sso(ctx)
    if isinstance(sso, Response):
        return sso
    try:
        start = sso.client.begin_login()
    except ProviderError as e:
        log.warning("single sign-on: the provider cannot begin a login: %s", e)
        return _to_portal("provider")
    answer = RedirectResponse(start.authorize_url, 302)
    kept = {"state": start.state, "nonce": start.nonce, "verifier": start.code_verifier}
    _cookie(answer, request, LOGIN_COOKIE, seal(sso.key, "sso-login", kept, LOGIN_TTL_S), LOGIN_TTL_S, COOKIE_PATH)
    return answer


def _record(ctx: Context, request: Request, status: int, actor: str | None) -> None:
    """The audit record of a browser's sign-in (a GET, which the audit middleware does not record)."""
    given = request.headers.get("x-request-id", "")
    entry = audit.Entry(
        given if _REQUEST_ID.fullmatch(given) else str(uuid.uuid4()), "GET /api/v1/sso/callback",
        "/api/v1/sso/callback", status, request.client.host if request.client else None, None,
        audit.Note(actor=None if actor is None else actor[: audit.MAX_TEXT]),
    )  # fmt: skip
    try:
        with ctx.sessions() as session:
            audit.record(session, entry)
    except Exception:
        log.exception("could not write the audit record of a single sign-on")


@router.get("/callback", status_code=303, response_class=RedirectResponse)
def sso_callback(
    ctx: ContextDep,
    session: SessionDep,
    request: Request,
    code: str | None = None,
    state: str | None = None,
    error: str | None = None,
    login_cookie: Annotated[str | None, Cookie(alias=LOGIN_COOKIE)] = None,
) -> Response:
    """Where the provider sends the browser back: finish the login, open a session, and hand it to the portal
    in a one-time cookie. A refusal goes to the sign-in page with a short reason."""
    sso = _sso(ctx)
    if isinstance(sso, Response):
        return sso
    kept = unseal(sso.key, "sso-login", login_cookie)
    if error is not None:  # the person (or the provider) declined: its text stays out of our page
        _record(ctx, request, 403, None)
        return _to_portal("provider_denied")
    if kept is None or not code or not state:
        _record(ctx, request, 403, None)
        return _to_portal("state")
    try:
        who = sso.client.finish_login(code[:2048], state[:512], kept["state"], kept["nonce"], kept["verifier"])
    except LoginRefused as e:
        log.info("single sign-on refused: %s", e)
        _record(ctx, request, 403, None)
        return _to_portal(e.reason)
    except ProviderError as e:
        log.warning("single sign-on: the provider failed: %s", e)
        _record(ctx, request, 502, None)
        return _to_portal("provider")
    try:
        token, expiry, principal = sign_in(session, who, sso.roles)
    except Refused as e:
        ctx.principals.clear()  # the user's rights may have changed: its other tokens hear so at once
        log.info("single sign-on refused for %s at %s: %s", who.subject, who.issuer, e.message)
        _record(ctx, request, 403, who.email)
        return _to_portal(e.code)
    ctx.principals.clear()
    _record(ctx, request, 303, principal.name)
    answer = RedirectResponse("/#/sso", 303)
    answer.headers["Cache-Control"] = "no-store"
    answer.delete_cookie(LOGIN_COOKIE, path=COOKIE_PATH)
    set_session_cookies(answer, request, token, expiry)
    handoff = seal(sso.key, "sso-handoff", {"token": token, "expires_at": expiry}, HANDOFF_TTL_S)
    _cookie(answer, request, HANDOFF_COOKIE, handoff, HANDOFF_TTL_S, COOKIE_PATH)
    return answer


@router.post("/session", response_model=LoginResponse, dependencies=[Depends(no_store)])
def sso_session(
    ctx: ContextDep,
    session: SessionDep,
    handoff: Annotated[str | None, Cookie(alias=HANDOFF_COOKIE)] = None,
) -> Response:
    """The portal's last step of a single sign-on: the session the callback opened, from its one-time cookie
    (which this clears). Needs no token."""
    sso = _sso(ctx)
    if isinstance(sso, Response):
        return sso
    kept = unseal(sso.key, "sso-handoff", handoff)
    who = ctx.principals.get(session, str(kept["token"])) if kept is not None else None
    if kept is None or who is None:
        answer = JSONResponse({"detail": "no single sign-on to complete: sign in again"}, 401)
    else:
        audit.note(actor=who.name)
        out = LoginResponse(token=str(kept["token"]), expires_at=float(kept["expires_at"]), name=who.name,
                            role=who.role)  # fmt: skip
        answer = JSONResponse(out.model_dump())
    answer.headers["Cache-Control"] = "no-store"
    answer.delete_cookie(HANDOFF_COOKIE, path=COOKIE_PATH)
    return answer


@router.post("/device", response_model=DeviceStart, dependencies=[Depends(no_store)])
def sso_device_begin(ctx: ContextDep) -> Response:
    """Begin the CLI's login (the provider's device flow): a code for the person to approve in a browser, and a
    handle to poll with. Needs no token."""
    sso = _sso(ctx)
    if isinstance(sso, Response):
        return sso
    try:
        device = sso.client.begin_device()
    except ProviderError as e:
        log.warning("single sign-on: the provider cannot begin a device login: %s", e)
        return JSONResponse({"detail": "the identity provider cannot begin a device login now"}, 502)
    handle = sso.devices.add(device)
    if handle is None:
        return JSONResponse({"detail": "too many device logins under way; try again later"}, 503,
                            headers={"Retry-After": "30"})  # fmt: skip
    out = DeviceStart(
        handle=handle, user_code=device.user_code, verification_uri=device.verification_uri,
        verification_uri_complete=device.verification_uri_complete, interval=device.interval,
        expires_in=device.expires_in,
    )  # fmt: skip
    return JSONResponse(out.model_dump(), headers={"Cache-Control": "no-store"})


@router.post(
    "/device/{handle}",
    response_model=LoginResponse,
    dependencies=[Depends(no_store)],
    responses={202: {"model": DevicePending}, 410: {"description": "the device code expired"}},
)
def sso_device_poll(ctx: ContextDep, session: SessionDep, handle: Annotated[str, Path(max_length=64)]) -> Response:
    """Poll a device login once: 202 while the person has not approved it (wait `interval` seconds), 200 with
    the session once they have, 403 when refused, 410 when the code expired. At most once per interval."""
    sso = _sso(ctx)
    if isinstance(sso, Response):
        return sso
    found, wait = sso.devices.take_turn(handle)
    if found is None:
        return _json({"detail": "this device login expired or does not exist; begin again"}, 410)
    if wait > 0:
        return _json({"detail": f"poll at most every {found.interval:g} s"}, 429, {"Retry-After": str(int(wait) + 1)})
    try:
        who = sso.client.poll_device(found.device.device_code, found.device.code_verifier)
    except DeviceSlowDown:
        sso.devices.slow_down(found, DeviceSlowDown.increase)
        return _json(DevicePending(status="slow_down", interval=int(found.interval)).model_dump(), 202)
    except LoginRefused as e:
        sso.devices.drop(handle)
        if e.reason == "device_expired":
            return _json({"detail": "the code expired before it was approved; begin again"}, 410)
        log.info("single sign-on (device) refused: %s", e)
        return _json({"detail": f"the identity provider refused this login ({e.reason})"}, 403)
    except ProviderError as e:
        log.warning("single sign-on: the provider failed a device poll: %s", e)
        return _json({"detail": "the identity provider cannot be reached now; poll again"}, 502)
    if who is None:
        return _json(DevicePending(status="pending", interval=int(found.interval)).model_dump(), 202)
    sso.devices.drop(handle)
    try:
        token, expiry, principal = sign_in(session, who, sso.roles)
    except Refused as e:
        audit.note(actor=who.email)
        return _json({"detail": e.message}, 403)
    finally:
        ctx.principals.clear()  # the user's rights may have changed: its other tokens hear so at once
    audit.note(actor=principal.name)
    return _json(LoginResponse(token=token, expires_at=expiry, name=principal.name, role=principal.role).model_dump())


def _json(body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status, headers={"Cache-Control": "no-store", **(headers or {})})
