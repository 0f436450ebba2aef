"""What an image may be called in a workload: a plain name, `[registry[:port]/]path[:tag][@sha256:digest]`, as
Docker's reference grammar has it. Never a transport (`oci-archive:PATH`, `dir:PATH`, `docker-daemon:...`): on the
local backend root's podman would load a file the tenant chose into the host's image store, under a name every
project resolves (one project would change what another's image name runs)."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

TRANSPORTS = frozenset(
    {"containers-storage", "docker", "docker-archive", "docker-daemon", "oci", "oci-archive", "dir", "ostree", "sif",
     "tarball"}
)  # fmt: skip
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
REFERENCE = re.compile(
    rf"(?:(?P<domain>(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    rf"(?::[0-9]+)?)/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@sha256:[0-9a-f]{64})?"
)


def expanded(image: str) -> str:
    """The name as Docker reads it: a registry where none is given (docker.io), `library/` for its official images,
    and `:latest` where neither tag nor digest is."""
    first, _, rest = image.partition("/")
    domain = rest and ("." in first or ":" in first or first == "localhost")
    name = image if domain else f"docker.io/{image if rest else 'library/' + image}"
    last = name.rsplit("/", 1)[-1]
    return name if ":" in last or "@" in last else f"{name}:latest"


def allowed(image: str, patterns: Sequence[str]) -> bool:
    """Whether one of `patterns` (shell-style) matches the image as given or as Docker expands it."""
    names = {image, expanded(image)}
    return any(fnmatch.fnmatchcase(name, p) for p in patterns for name in names)


def refused(image: str | None) -> str | None:
    """Why `image` is not a plain image name, or None."""
    if image is None:
        return None
    head = image.split(":", 1)[0]
    if "/" not in head and head.lower() in TRANSPORTS:
        return f"image {image!r} names a transport ({head}:): give an image's name, like registry/name:tag"
    if len(image) > 512 or REFERENCE.fullmatch(image) is None:
        return f"image {image!r} is not an image name: give one like registry/name:tag or name@sha256:<digest>"
    return None
