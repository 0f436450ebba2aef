"""Wire models of code upload: manifests, missing blobs, limits. client/code.py builds the manifests."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import Field

from gpupool.models.wire import (
    CODE_DIGEST,
    Name,
    Reply,
    Wire,
)


class CodeFile(Wire):
    """One entry of a code manifest: a regular file (mode, size, sha256 and the chunks it is cut into) or a
    symbolic link (`link`, a target inside the tree)."""

    path: str = Field(min_length=1, max_length=4096)
    mode: int = Field(0o644, ge=0, le=0o777)
    size: int = Field(0, ge=0, le=2**40)
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    chunks: list[Annotated[str, Field(pattern=CODE_DIGEST)]] = Field(default_factory=list, max_length=2**20)
    link: str | None = Field(None, min_length=1, max_length=4096)


class CodeManifest(Wire):
    """A code tree, sorted by path. Its digest is the SHA-256 of its canonical JSON (client/code.py writes it)."""

    version: Literal[1] = 1
    files: list[CodeFile] = Field(default_factory=list, max_length=100_000)

    def canonical(self) -> bytes:
        """The bytes its digest is taken of: sorted keys, no spaces, every field spelled out."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()


class CodeMissing(Wire):
    project: Name
    digests: list[Annotated[str, Field(pattern=CODE_DIGEST)]] = Field(default_factory=list, max_length=20_000)


class CodeMissingReply(Reply):
    missing: list[str]
    """Those of the asked digests this project has not uploaded (their bytes must be sent)."""


class CodeLimits(Reply):
    max_bytes: int
    """The largest code tree the server takes (its files' sizes summed)."""
    chunk_bytes: int
    """The largest blob: files are cut into chunks of this size."""


class CodeStored(Reply):
    code: str
    """`sha256:<hex>`: what WorkloadCreate.code takes."""
    files: int
    size: int
