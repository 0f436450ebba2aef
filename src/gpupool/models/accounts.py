"""Wire models of users, sign-in and single sign-on."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpupool.models.access import TokenPublic
from gpupool.models.wire import (
    NO_NUL,
    CallerRole,
    Name,
    Reply,
    Role,
    ShortText,
    Wire,
)


class UserCreate(Wire):
    name: Name
    role: Role = "member"
    projects: list[ShortText] = Field(default_factory=list, max_length=100)


UserState = Literal["active", "disabled", "deleted"]


class UserPublic(Reply):
    name: str
    role: Role
    projects: list[str]
    state: UserState = "active"
    """disabled: nothing it holds signs in until an admin enables it; deleted: listed only when asked for."""


class Offboarding(Wire):
    keep_work: bool = False
    """Leave the user's live workloads running (by default they are cancelled, saying why)."""


class Offboarded(Reply):
    """What disabling, deleting or removing someone from a project did."""

    user: str
    state: UserState
    stopped: list[str] = Field(default_factory=list)
    """Their workloads cancelled by it, as project/name."""
    service_tokens: list[TokenPublic] = Field(default_factory=list)
    """Live service tokens they made: their projects', left working (revoke any they may still know)."""


class UserCreated(UserPublic):
    token: str
    """Shown once; the server keeps only its hash."""


class LoginRequest(Wire):
    name: str = Field(max_length=63, pattern=NO_NUL)
    password: str = Field(max_length=1024)


class LoginResponse(Reply):
    token: str
    expires_at: float
    name: str
    role: CallerRole


class PasswordSet(Wire):
    password: str = Field(min_length=8, max_length=1024)
    current: str | None = Field(None, max_length=1024)
    """Your current password, when you change your own (and have one)."""


class WhoAmI(Reply):
    name: str
    role: CallerRole
    projects: list[str]
    departments: list[str] = Field(default_factory=list)
    """Departments the caller administers."""


class SsoConfig(Reply):
    """Whether this server offers single sign-on (the portal shows its button only then)."""

    enabled: bool


class DeviceStart(Reply):
    """A device login under way: show `user_code` and open `verification_uri_complete` (or `verification_uri`
    and type the code); poll `POST /api/v1/sso/device/{handle}` every `interval` seconds for `expires_in`."""

    handle: str
    user_code: str
    verification_uri: str
    verification_uri_complete: str | None
    interval: int
    expires_in: int


class DevicePending(Reply):
    """Not approved yet: poll again in `interval` seconds (more after the provider's slow_down)."""

    status: Literal["pending", "slow_down"]
    interval: int
