"""Wire models of code upload: manifests, missing blobs, limits. client/code.py builds the manifests."""

from __future__ import annotations

import json
from collections.abc import Mapping
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


MAX_LINKS = 40
"""How many links one path may pass through (the kernel's own bound, MAXSYMLINKS): more is refused as a loop."""


def resolve_link(links: Mapping[str, str], path: str) -> str:
    """Where the link `path` of a tree finally leads, as a path inside the tree ('' for its top), resolved as the
    kernel would: its target from the link's own directory, each component that is a link (`links`: path ->
    target) replaced by that link's target, `..` going up. ValueError, saying why, where the target leaves the
    tree (an absolute target, or a `..` above its top, even through `d -> .` and `d/d/../..`), or where it is a
    loop of links or passes through more than MAX_LINKS. A `..` after a component the tree lacks is taken
    lexically: stricter than the kernel, which would stop there, so a directory made later opens no way out."""
    target = links[path]
    if target.startswith("/"):
        raise ValueError(f"points outside the tree: its target {target[:200]!r} is an absolute path")
    here = path.split("/")[:-1]
    pending = list(reversed(target.split("/")))
    followed = [path]
    seen: set[tuple[str, tuple[str, ...]]] = set()

    def chain() -> str:
        return " -> ".join(repr(p[:200]) for p in followed[:8]) + (" ..." if len(followed) > 8 else "")

    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if not here:
                via = f" (through {chain()})" if len(followed) > 1 else ""
                raise ValueError(f"points outside the tree: its target {target[:200]!r} leads above its top{via}")
            here.pop()
            continue
        here.append(part)
        at = "/".join(here)
        next_target = links.get(at)
        if next_target is None:
            continue
        if (at, tuple(pending)) in seen:
            raise ValueError(f"is a loop of links ({chain()} -> {at[:200]!r})")
        if len(followed) > MAX_LINKS:
            raise ValueError(f"passes through more than {MAX_LINKS} links ({chain()})")
        seen.add((at, tuple(pending)))
        followed.append(at)
        if next_target.startswith("/"):
            raise ValueError(
                f"points outside the tree: it passes through {chain()}, whose target {next_target[:200]!r} is absolute"
            )
        here.pop()
        pending.extend(reversed(next_target.split("/")))
    return "/".join(here)


def tree_problem(manifest: CodeManifest) -> str | None:
    """Why a manifest is not a tree that can be placed safely, or None: paths relative and normal (no '..', '.',
    empty part or leading '/'), sorted, each once, none inside a file or link; links without contents, each
    leading, through every other link, to a place inside the tree (resolve_link)."""
    seen: set[str] = set()
    links: dict[str, str] = {}
    last = ""
    for f in manifest.files:
        parts = f.path.split("/")
        if f.path.startswith("/") or any(part in ("", ".", "..") for part in parts) or "\x00" in f.path:
            return f"path {f.path[:200]!r} is not a normal relative path (no '..', '.', '//' or leading '/')"
        if f.path in seen:
            return f"path {f.path[:200]!r} appears twice"
        if f.path < last:
            return "the manifest's files are not sorted by path"
        last = f.path
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in seen:
                return f"path {f.path[:200]!r} is inside {'/'.join(parts[:i])!r}, which is a file"
        seen.add(f.path)
        if f.link is not None:
            if "\x00" in f.link:
                return f"link {f.path[:200]!r} has a NUL in its target"
            if f.chunks or f.size or f.sha256:
                return f"link {f.path[:200]!r} has contents"
            links[f.path] = f.link
        elif f.sha256 is None:
            return f"file {f.path[:200]!r} has no sha256"
    for path in links:
        try:
            resolve_link(links, path)
        except ValueError as e:
            return f"link {path[:200]!r} {e}"
    return None


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
