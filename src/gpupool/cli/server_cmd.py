"""`gpupool server`: everything on embedded defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from gpupool.cli.connection import fail
from gpupool.settings import Settings, default_data_dir


def _numbers(items: list[str] | None, flag: str, form: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items or []:
        key, _, value = item.partition("=")
        try:
            out[key] = float(value)
        except ValueError:
            fail(f"{flag} {item!r}: expected {form}", 2)
    return out


def server(
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="Store, logs and workdirs.")] = None,
    db: Annotated[str | None, typer.Option("--db", help="postgresql://... (default: SQLite in the data dir).")] = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8470,
    backend: Annotated[str, typer.Option("--backend", help="local (this host) or kubernetes.")] = "local",
    kubeconfig: Annotated[
        str | None, typer.Option("--kubeconfig", help="For --backend kubernetes; default: in-cluster config.")
    ] = None,
    pool_label: Annotated[
        str, typer.Option("--pool-label", help="Node label naming a node's pool.")
    ] = "gpupool.io/pool",
    image: Annotated[str, typer.Option("--image", help="Default container image (kubernetes).")] = "python:3.12-slim",
    gpus: Annotated[str, typer.Option("--gpus", help="auto, nvml, or fake:<count>x<model>-<memory GB>[,...]")] = "auto",
    pool: Annotated[str, typer.Option("--pool", help="The pool this host's GPUs belong to.")] = "default",
    interval: Annotated[float, typer.Option("--interval", help="Longest seconds between scheduling cycles.")] = 2.0,
    grace: Annotated[float, typer.Option("--grace", help="Default seconds from SIGTERM to SIGKILL.")] = 30.0,
    telemetry: Annotated[float, typer.Option("--telemetry-interval", help="Seconds between GPU samples.")] = 5.0,
    price: Annotated[
        list[str] | None, typer.Option("--price", help="POOL=PRICE of one GPU-hour, for cost reports (repeatable).")
    ] = None,
    min_runtime: Annotated[
        list[str] | None, typer.Option("--min-runtime", help="CLASS=SECONDS, overriding a class's minimum runtime.")
    ] = None,
    single_user: Annotated[
        bool,
        typer.Option(
            "--single-user",
            help="Run workloads as this server's user, with NO isolation between tenants (one person's machine).",
        ),
    ] = False,
    public_url: Annotated[
        str | None, typer.Option("--public-url", help="How users reach this server, e.g. https://gpu.example.org.")
    ] = None,
) -> None:
    """Start gpupool: API on 127.0.0.1:8470, scheduler, local backend, SQLite store."""
    from gpupool.server import StartupError, serve

    overrides = _numbers(min_runtime, "--min-runtime", "CLASS=SECONDS")
    prices = _numbers(price, "--price", "POOL=PRICE, e.g. default=2.50")
    if db is not None and not db.startswith(("postgresql://", "postgresql+psycopg://", "sqlite:///")):
        fail(f"--db {db!r}: expected postgresql://user@host/dbname or sqlite:///path", 2)
    try:
        settings = Settings(
            data_dir=data_dir or default_data_dir(), db_url=db, backend=backend, kubeconfig=kubeconfig,
            pool_label=pool_label, default_image=image, host=host, port=port, gpus=gpus, pool=pool,
            interval_s=interval, grace_s=grace, min_runtime_s=overrides or None, telemetry_interval_s=telemetry,
            prices=prices, single_user=single_user, public_url=public_url,
        )  # fmt: skip
        serve(settings)
    except (ValidationError, StartupError) as e:
        fail(str(e), 2)
