"""The base of the wire models: a request refuses unknown fields, an answer is read tolerantly; the names,
kinds and numeric limits every model shares are declared once, here.

The client and the CLI import the models too, so they depend on pydantic (and the lifecycle's enums) only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from gpupool.lifecycle.phases import AllocPhase, Phase

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_DNS = re.compile(DNS_LABEL)


def _dns_safe(value: str) -> str:
    if not _DNS.fullmatch(value):  # match() would let a trailing newline through ($ matches before it)
        raise ValueError(
            f"{value[:80]!r} is not a DNS-safe name: use 1-63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return value


Name = Annotated[str, AfterValidator(_dns_safe)]
Role = Literal["admin", "member", "viewer"]
CallerRole = Literal["admin", "department-admin", "member", "viewer"]
WorkloadType = Literal["notebook", "training", "inference", "batch"]
WorkloadState = Phase
"""As a filter (a request): one this server knows."""
SeenState = Phase | str
"""In an answer: a phase this release knows, or, from a newer server, one it does not (kept as text)."""
SeenAllocState = AllocPhase | str
T = TypeVar("T")

# Numbers are bounded here, before they reach int() or the database: no NaN or Infinity, integers within what
# their column holds (the store's Integer columns are 32-bit, BigInteger ones 64-bit), times within ISO dates.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
UNIX_MIN, UNIX_MAX = -62_135_596_800.0, 253_402_300_799.0
"""Unix seconds of 0001-01-01 and of 9999-12-31T23:59:59 UTC: the instants an ISO date can name."""
PolicySeconds = Annotated[float, Field(le=100 * 365 * 86400, allow_inf_nan=False)]
"""A policy's limit in seconds (the use case refuses zero and below, with its own reason)."""
NO_NUL = r"^[^\x00]*$"
"""No name holds a NUL byte, and PostgreSQL refuses one in text: a lookup by it is refused, not a 500."""
ShortText = Annotated[str, Field(max_length=63, pattern=NO_NUL)]


class Wire(BaseModel):
    """What a client sends: an unknown field is refused (a typo, or a field this server does not know)."""

    model_config = ConfigDict(extra="forbid")


class Reply(BaseModel):
    """What the server answers: read tolerantly, so a client of this release keeps working against a newer server
    that answers with more fields."""

    model_config = ConfigDict(extra="ignore")


def states_named(values: Iterable[str]) -> list[Phase]:
    """The states a list filter names, each value one state or several separated by commas (`running,pending`, as
    `gpupool list --state` takes them), each once, in the order given; ValueError naming the valid ones."""
    out: list[Phase] = []
    for name in (n.strip() for value in values for n in value.split(",")):
        if name not in tuple(Phase):
            raise ValueError(f"{name[:40]!r} is not a state; the states: {', '.join(Phase)}")
        if Phase(name) not in out:
            out.append(Phase(name))
    return out


CODE_DIGEST = r"^sha256:[0-9a-f]{64}$"
"""A content address: what a code manifest or one of its blobs is named by."""
