"""`gpupool submit` and `gpupool apply`: a workload from flags or from a YAML file, checked before it is sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, get_args

import typer
from pydantic import ValidationError

from gpupool.cli import spec
from gpupool.cli.connection import Output, OutputOpt, client, default_project, emit_json, fail, read_mapping
from gpupool.client import Client
from gpupool.client.client import ApiError
from gpupool.client.code import CodeError, upload_tree
from gpupool.durations import duration_flag
from gpupool.lifecycle.phases import TERMINAL, RetryOn
from gpupool.models import sizes
from gpupool.models.schemas import WorkloadCreate, WorkloadPublic
from gpupool.models.sizes import size_flag
from gpupool.models.wire import WorkloadType

TYPES: tuple[str, ...] = get_args(WorkloadType)
PRIORITIES = ("production", "training", "interactive", "batch")
"""The server's priority classes (gpupool.core.priority.DEFAULT_CLASSES; a test keeps the two the same). Named here
because the CLI's distribution does not carry the core."""

ProjectOpt = Annotated[
    str | None,
    typer.Option("-p", "--project", help="The project (default: `gpupool config set project`, else your only one)."),
]


def project_of(c: Client, project: str | None) -> str:
    chosen = project or default_project()
    if chosen:
        return chosen
    mine = c.whoami().projects
    if len(mine) == 1:
        return mine[0]
    fail("say which project with -p PROJECT" + (f" (yours: {', '.join(mine)})" if mine else ""), 2)


Workdir = Annotated[
    Path | None,
    typer.Option("--workdir", help="The directory sent as the job's code, where it starts (default: this one)."),
]
NoCode = Annotated[bool, typer.Option("--no-code", help="Send no code: the job starts in an empty directory.")]


def code_of(c: Client, project: str, workdir: Path | None, no_code: bool) -> str | None:
    """The `code` of a workload: the directory uploaded (only what the project has not sent before; the current
    one unless `--workdir` names another), or None (`--no-code`, or an empty directory)."""
    if no_code:
        return None
    directory = workdir if workdir is not None else Path.cwd()
    try:
        sent = upload_tree(c, directory, project)
    except CodeError as e:
        fail(f"{e.reason} (or send another directory with --workdir DIR, or none with --no-code)", 2)
    return sent.code if sent.files else None  # an empty directory is no code, as with --no-code


def _one_of(workdir: Path | None, no_code: bool) -> None:
    if no_code and workdir is not None:
        fail("--workdir and --no-code: give one or the other", 2)


def choice(value: str | None, flag: str, valid: tuple[str, ...]) -> None:
    if value is not None and value not in valid:
        fail(f"{flag} {value!r}: expected one of {', '.join(valid)}", 2)


def _validation(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'workload'}: {err['msg']}" for err in e.errors())


def _submitted(w: WorkloadPublic, output: Output) -> None:
    if output is Output.json:
        emit_json(w)
    else:
        # A finished name submitted again: say so, or the new run looks like the old one's name taken by mistake.
        again = f"; run {w.run} of {w.name}, the earlier runs its history (gpupool describe {w.name})"
        print(f"workload {w.name} submitted to {w.project} ({w.type}, {w.gpu_request}, {w.priority}): {w.state}"
              + (again if w.run > 1 else ""))  # fmt: skip


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as docker's --env-file and .env files have them: blank lines and # comments skipped, an
    optional `export `, one pair of matching quotes around a value removed."""
    try:
        text = path.read_text()
    except OSError as e:
        fail(f"--env-file {path}: {e.strerror}", 2)
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        key = key.strip()
        if not sep or not key or any(c.isspace() for c in key):
            fail(f"--env-file {path}:{number}: expected KEY=VALUE, got {raw.strip()[:60]!r}", 2)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
    return out


def _pairs(items: list[str] | None) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            fail(f"--env {item!r}: expected KEY=VALUE", 2)
        pairs[key] = value
    return pairs


def _mount(flag: str) -> dict[str, Any]:
    """`NAME:/path` or `NAME:/path:ro`, as the API's VolumeMount (which checks the name and the path)."""
    name, sep, path = flag.partition(":")
    read_only = path.endswith(":ro")
    path = path.removesuffix(":ro").removesuffix(":rw")
    if not sep or not name or not path:
        fail(f"--volume {flag!r}: expected NAME:/path or NAME:/path:ro", 2)
    return {"name": name, "path": path, "read_only": read_only}


def _lost_policy(flag: str | None) -> dict[str, Any] | None:
    if flag is None:
        return None
    if flag == "wait":
        return {"action": "wait"}
    try:
        return {"action": "requeue", "after_s": duration_flag(flag)}
    except ValueError as e:
        fail(f"--on-cluster-lost {flag!r}: 'wait' or a duration like 10m ({e})", 2)


def submit(
    command: Annotated[list[str] | None, typer.Argument(help="The command to run, after --.")] = None,
    project: ProjectOpt = None,
    name: Annotated[str | None, typer.Option("--name", help="A DNS-safe name (default: generated).")] = None,
    type_: Annotated[str, typer.Option("--type", help=f"{', '.join(TYPES)}.")] = "training",
    gpu: Annotated[float | None, typer.Option("--gpu", help="A fraction of one GPU, e.g. 0.25.")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="Whole GPUs (per worker).")] = None,
    gpu_memory: Annotated[
        str | None, typer.Option("--gpu-memory", parser=size_flag, help=f"GPU memory, e.g. 20GiB ({sizes.HELP}).")
    ] = None,
    cpu: Annotated[float | None, typer.Option("--cpu", help="CPU cores per member, e.g. 4 or 0.5.")] = None,
    memory: Annotated[
        str | None,
        typer.Option("--memory", parser=size_flag, help=f"Host memory per member, e.g. 16GiB ({sizes.HELP})."),
    ] = None,
    pools: Annotated[list[str] | None, typer.Option("--pool", help="A pool it may run in (repeatable).")] = None,
    gpu_models: Annotated[
        list[str] | None, typer.Option("--gpu-model", help="A GPU model it accepts, e.g. H100 (repeatable).")
    ] = None,
    clusters: Annotated[
        list[str] | None, typer.Option("--cluster", help="A cluster it may run in, by preference (repeatable).")
    ] = None,
    mlflow: Annotated[
        str | None, typer.Option("--mlflow", help="An MLflow tracking server for its run (default: its project's).")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Serve this MLflow model (models:/NAME/VERSION) with no command (inference)."),
    ] = None,
    on_cluster_lost: Annotated[
        str | None,
        typer.Option(
            "--on-cluster-lost",
            help="When its cluster goes down: 'wait' for it, or a duration after which it is requeued elsewhere, "
            "e.g. 10m (default: notebooks wait, the rest 15m).",
        ),
    ] = None,
    image: Annotated[str | None, typer.Option("--image", help="A container image to run the command in.")] = None,
    volumes: Annotated[
        list[str] | None,
        typer.Option("--volume", "-v", help="A project volume to mount: NAME:/path, or NAME:/path:ro (repeatable)."),
    ] = None,
    workers: Annotated[int, typer.Option("--workers", help="Gang members, started all at once.")] = 1,
    priority: Annotated[str | None, typer.Option("--priority", help=f"{', '.join(PRIORITIES)}.")] = None,
    preemptible: Annotated[bool | None, typer.Option("--preemptible/--no-preemptible")] = None,
    port: Annotated[int | None, typer.Option("--port", help="The port a notebook or service listens on.")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="KEY=VALUE (repeatable; over --env-file's).")] = None,
    env_file: Annotated[Path | None, typer.Option("--env-file", help="A file of KEY=VALUE lines.")] = None,
    grace: Annotated[
        float | None, typer.Option("--grace", parser=duration_flag, help="From SIGTERM to SIGKILL, e.g. 30s.")
    ] = None,
    max_duration: Annotated[
        float | None,
        typer.Option("--max-duration", parser=duration_flag, help="Stopped once it has run this long, e.g. 4h or 3d."),
    ] = None,
    retry: Annotated[str | None, typer.Option("--retry", help=f"Start it again: {', '.join(RetryOn)}.")] = None,
    max_retries: Annotated[
        int | None, typer.Option("--max-retries", help="At most this many times (default 3).")
    ] = None,
    retry_backoff: Annotated[
        float | None,
        typer.Option("--retry-backoff", parser=duration_flag, help="Wait before the first retry, doubling (10s)."),
    ] = None,
    workdir: Workdir = None,
    no_code: NoCode = False,
    idempotency_key: Annotated[str | None, typer.Option("--idempotency-key", help="Retry-safe submit.")] = None,
    output: Output = OutputOpt,
) -> None:
    """Submit a workload: `gpupool submit -p vision --gpus 1 --workdir . -- python train.py` runs train.py from
    this directory, which goes with the job (without what .gitignore and .gpupoolignore leave out)."""
    choice(type_, "--type", TYPES)
    choice(priority, "--priority", PRIORITIES)
    choice(retry, "--retry", tuple(RetryOn))
    if gpu is not None and not 0 < gpu < 1:  # the server refuses it too, in the API's words (gpu, gpus)
        fail(f"--gpu {gpu:g} is not a fraction between 0 and 1; ask for whole GPUs with --gpus", 2)
    if retry is None and (max_retries is not None or retry_backoff is not None):
        fail("--max-retries and --retry-backoff go with --retry on-failure, on-preemption or always", 2)
    _one_of(workdir, no_code)
    pairs = (read_env_file(env_file) if env_file else {}) | _pairs(env)
    mounts = [_mount(v) for v in volumes or []]
    with client() as c:
        project = project_of(c, project)
        fields: dict[str, Any] = {
            "project": project, "name": name, "type": type_, "gpu": gpu, "gpus": gpus,
            "gpu_memory": gpu_memory, "cpu": cpu, "memory": memory, "pools": pools or [],
            "gpu_models": gpu_models or [], "image": image, "volumes": mounts, "clusters": clusters or [],
            "on_cluster_lost": _lost_policy(on_cluster_lost), "mlflow_uri": mlflow, "model": model,
            "workers": workers, "priority": priority, "preemptible": preemptible, "port": port, "env": pairs,
            "command": list(command or []), "grace_s": grace, "max_duration_s": max_duration,
        }  # fmt: skip
        if retry is not None:
            given = {"max_retries": max_retries, "backoff_s": retry_backoff}
            fields["retry"] = {"on": retry} | {k: v for k, v in given.items() if v is not None}
        try:
            WorkloadCreate.model_validate(fields)  # checked before anything is uploaded
            body = WorkloadCreate.model_validate(fields | {"code": code_of(c, project, workdir, no_code)})
        except ValidationError as e:
            fail(_validation(e), 2)
        _submitted(c.submit(body, idempotency_key), output)


def apply(
    file: Annotated[
        Path | None, typer.Option("-f", "--file", help="A workload in YAML (the fields of submit).")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace the live workload of that name if its spec differs.")
    ] = False,
    workdir: Workdir = None,
    no_code: NoCode = False,
    schema: Annotated[
        bool, typer.Option("--schema", help="Print the JSON Schema of the file, for editors, and stop.")
    ] = False,
    output: Output = OutputOpt,
) -> None:
    """Submit the workload described in a YAML file, with the file's `workdir:` (relative to the file) as its
    code, or --workdir DIR, or none with --no-code. Resources go at the top level or under `resources:` (gpu,
    gpus, gpu_memory, cpu, memory, gpu_model: a name or a list, pools)."""
    if schema:
        print(json.dumps(spec.schema(), indent=2))
        return
    if file is None:
        fail("say which file with -f FILE (or - for stdin)", 2)
    _one_of(workdir, no_code)
    data = read_mapping(file, "workload fields (project, name, type, gpus, command, ...)")
    try:
        data = spec.normalise(data)
    except spec.SpecError as e:
        fail(f"{file}: {e}", 2)
    for field, valid in (("type", TYPES), ("priority", PRIORITIES)):
        if data.get(field) is not None and data[field] not in valid:
            fail(f"{file}: {field} {data[field]!r}: expected one of {', '.join(valid)}", 2)
    # Not a field of the workload: the submit's retry key, sent as the Idempotency-Key header.
    key = data.pop("idempotency_key", None)
    if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= 128):
        fail(f"{file}: idempotency_key is a string of 1 to 128 characters", 2)
    here = file.parent if str(file) != "-" else Path.cwd()
    env_file = data.pop("env_file", None)
    if env_file is not None:
        if not isinstance(env_file, str):
            fail(f"{file}: env_file is a file's path, relative to the file", 2)
        env = data.get("env") or {}
        if not isinstance(env, dict):
            fail(f"{file}: env is a mapping of NAME: value", 2)
        data["env"] = read_env_file(here / env_file) | env  # the file's own env wins, as --env over --env-file
    declared = data.pop("workdir", None)
    if declared is not None and workdir is None and not no_code:
        if not isinstance(declared, str):
            fail(f"{file}: workdir is a directory's path, relative to the file", 2)
        workdir = here / declared
    with client() as c:
        if "project" not in data:
            data["project"] = project_of(c, None)
        try:
            WorkloadCreate.model_validate(data)
            if "code" not in data:
                data["code"] = code_of(c, str(data["project"]), workdir, no_code)
            body = WorkloadCreate.model_validate(data)
        except ValidationError as e:
            fail(f"{file}: {_validation(e)}", 2)
        if body.name is None:  # nothing to apply it to: a plain submit
            _submitted(c.submit(body, key), output)
            return
        try:
            done = c.apply(body, force)
        except ApiError as e:
            if e.status != 409:
                raise
            fail(f"{e.reason}\n(`gpupool apply -f {file} --force` replaces it)")
    if output is Output.json:
        emit_json(done)
    elif done.unchanged and done.state in TERMINAL:
        print(f"workload {done.name} unchanged (id {done.id}, {done.state}: this spec has run; "
              f"`gpupool rerun {done.name}` runs it again)")  # fmt: skip
    elif done.unchanged:
        print(f"workload {done.name} unchanged (id {done.id}, {done.state})")
    elif done.replaced is not None:
        print(f"workload {done.name} replaced: id {done.replaced} stopped, id {done.id} {done.state}")
    else:
        again = f"; run {done.run} of its name, the earlier runs its history" if done.run > 1 else ""
        print(f"workload {done.name} created (id {done.id}): {done.state}{again}")
