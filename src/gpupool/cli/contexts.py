"""The CLI's settings file: contexts, each a server with its URL, token and default project, and which is current.

`~/.config/gpupool/config.json` (under $XDG_CONFIG_HOME where set), mode 600 since it holds tokens. Flags win over
the environment (GPUPOOL_CONTEXT, GPUPOOL_URL, GPUPOOL_TOKEN, GPUPOOL_PROJECT), which wins over the file. A file
written before contexts existed (url, token and project at the top level) reads as one context named `default`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8470"
DEFAULT_CONTEXT = "default"
KEYS = ("url", "token", "project")
CONTEXT_ENV = "GPUPOOL_CONTEXT"

chosen: str | None = None
"""The root option --context, when given (set before any command runs)."""


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpupool" / "config.json"


@dataclass
class Config:
    current: str | None = None
    contexts: dict[str, dict[str, str]] = field(default_factory=dict)

    def selected(self) -> str:
        """The context commands use: --context, else $GPUPOOL_CONTEXT, else the current one."""
        return chosen or os.environ.get(CONTEXT_ENV) or self.current or DEFAULT_CONTEXT

    def context(self, name: str | None = None) -> dict[str, str]:
        """The settings of a context (empty, and not stored, if it does not exist)."""
        return self.contexts.get(name or self.selected(), {})

    def editable(self, name: str | None = None) -> dict[str, str]:
        """A context's settings to change in place, creating it (and making it current if none is)."""
        key = name or self.selected()
        self.current = self.current or key
        return self.contexts.setdefault(key, {})


def _strings(data: Any) -> dict[str, str]:
    return {k: v for k, v in data.items() if k in KEYS and isinstance(v, str)} if isinstance(data, dict) else {}


def load() -> Config:
    try:
        data = json.loads(config_path().read_text())
    except (OSError, ValueError):
        return Config()
    if not isinstance(data, dict):
        return Config()
    if "contexts" not in data:  # written by an older gpupool: one server, no name
        flat = _strings(data)
        return Config(DEFAULT_CONTEXT, {DEFAULT_CONTEXT: flat}) if flat else Config()
    raw = data.get("contexts")
    contexts = {str(k): _strings(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
    current = data.get("current-context")
    return Config(current if isinstance(current, str) else None, contexts)


def save(cfg: Config) -> Path:
    path = config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # O_CREAT's mode applies only to a new file: an old one may have been readable by others
    with os.fdopen(fd, "w") as f:
        json.dump({"current-context": cfg.current, "contexts": cfg.contexts}, f, indent=2)
    return path


def setting(cfg: Config, key: str) -> tuple[str | None, str]:
    """A setting's value and where it comes from: the environment, the selected context, or nowhere."""
    env = f"GPUPOOL_{key.upper()}"
    if os.environ.get(env):
        return os.environ[env], f"${env}"
    value = cfg.context().get(key)
    if value:
        return value, f"context {cfg.selected()}"
    if key == "url":
        return DEFAULT_URL, "default"
    return None, "not set"


def masked(token: str) -> str:
    """Enough of a token to tell two apart, never enough to use it."""
    return f"{token[:4]}…{token[-4:]}" if len(token) > 16 else "(set)"
