"""`gpupool config`: the settings file's contexts (one per server) and the current one's URL, token and project."""

from __future__ import annotations

from typing import Annotated

import typer

from gpupool.cli import contexts
from gpupool.cli.connection import Output, OutputOpt, emit_json, fail, print_table

config_app = typer.Typer(
    help="Your settings: contexts (a server's URL and your token there) and a default project. Flags win over "
    "GPUPOOL_CONTEXT, GPUPOOL_URL, GPUPOOL_TOKEN and GPUPOOL_PROJECT, which win over the file.",
    no_args_is_help=True,
)
Key = Annotated[str, typer.Argument(help="url, token or project.")]


def _key(key: str) -> str:
    if key not in contexts.KEYS:
        fail(f"{key!r}: expected one of {', '.join(contexts.KEYS)}", 2)
    return key


def _shown(key: str, value: str | None) -> str:
    if value is None:
        return "-"
    return contexts.masked(value) if key == "token" else value


@config_app.command("set")
def config_set(key: Key, value: str) -> None:
    """Set url, token or project in the current context: `gpupool config set project vision`."""
    cfg = contexts.load()
    cfg.editable()[_key(key)] = value
    path = contexts.save(cfg)
    print(f"{key} of context {cfg.selected()} set to {_shown(key, value)} in {path}")


@config_app.command("unset")
def config_unset(key: Key) -> None:
    """Remove url, token or project from the current context."""
    cfg = contexts.load()
    cfg.editable().pop(_key(key), None)
    contexts.save(cfg)
    print(f"{key} of context {cfg.selected()} unset")


@config_app.command("get")
def config_get(
    key: Annotated[str | None, typer.Argument(help="url, token or project (default: all, and their sources).")] = None,
    output: Output = OutputOpt,
) -> None:
    """What commands use now: the context, and its url, token (masked) and project with where each comes from."""
    cfg = contexts.load()
    if key is not None:
        value, source = contexts.setting(cfg, _key(key))
        if value is None:
            fail(f"{key} is {source} (context {cfg.selected()})", 1)
        print(_shown(key, value))
        return
    found = {k: contexts.setting(cfg, k) for k in contexts.KEYS}
    if output is Output.json:
        emit_json({"context": cfg.selected(), **{k: _shown(k, v) if v else None for k, (v, _) in found.items()}})
        return
    print(f"context: {cfg.selected()}" + ("" if cfg.selected() in cfg.contexts else " (not saved yet)"))
    for k, (value, source) in found.items():
        print(f"{k + ':':<9}{_shown(k, value)}" + (f"  ({source})" if value is not None else ""))


@config_app.command("use-context")
def use_context(name: str) -> None:
    """Make a saved context the current one."""
    cfg = contexts.load()
    if name not in cfg.contexts:
        known = ", ".join(sorted(cfg.contexts)) or "none; `gpupool login --context NAME` saves one"
        fail(f"no context {name!r} (contexts: {known})", 2)
    cfg.current = name
    contexts.save(cfg)
    print(f"current context: {name} ({cfg.contexts[name].get('url', contexts.DEFAULT_URL)})")


@config_app.command("get-contexts")
def get_contexts(output: Output = OutputOpt) -> None:
    """The saved contexts; * marks the one commands use."""
    cfg = contexts.load()
    if output is Output.json:
        emit_json({"current": cfg.current, "contexts": {n: {**c, "token": None} for n, c in cfg.contexts.items()}})
        return
    print_table(
        None,
        ("CURRENT", "NAME", "URL", "PROJECT", "TOKEN"),
        (("*" if name == cfg.selected() else "", name, c.get("url", contexts.DEFAULT_URL), c.get("project", "-"),
          _shown("token", c.get("token"))) for name, c in sorted(cfg.contexts.items())),
    )  # fmt: skip


@config_app.command("set-context")
def set_context(
    name: str,
    url: Annotated[str | None, typer.Option("--url", help="The server, e.g. https://gpupool.example.com")] = None,
    token: Annotated[str | None, typer.Option("--token", help="Your token there.")] = None,
    project: Annotated[str | None, typer.Option("--project", "-p", help="Its default project.")] = None,
) -> None:
    """Create a context, or change some of its settings (`gpupool login --context NAME` checks the token too)."""
    cfg = contexts.load()
    settings = cfg.editable(name)
    settings.update({k: v for k, v in (("url", url), ("token", token), ("project", project)) if v is not None})
    contexts.save(cfg)
    print(f"context {name} saved" + (" (current)" if cfg.current == name else ""))


@config_app.command("delete-context")
def delete_context(name: str) -> None:
    """Forget a context and its token."""
    cfg = contexts.load()
    if cfg.contexts.pop(name, None) is None:
        fail(f"no context {name!r}", 2)
    if cfg.current == name:
        cfg.current = None
    contexts.save(cfg)
    print(f"context {name} deleted")
