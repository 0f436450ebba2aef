"""The server image's Dockerfile, read rather than built (no image registry is reachable here to pull its base):
a Debian slim base pinned by tag, a final user that is the chart's and not root, COPY sources that exist and that
.dockerignore lets through, `gpupool server` on the chart's port with a health check on /healthz. The builder
stage's own steps (scripts/build-portal, then pip wheel) run on the files the build context would hold, and the
wheel they make carries the portal's npm assets and the `gpupool` entry point the image runs."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
MANIFESTS = REPO / "deploy" / "kubernetes" / "gpupool.yaml"
VALUES = REPO / "deploy" / "helm" / "gpupool" / "values.yaml"
EXTRAS = "[server,postgres,kubernetes]"
LEFTOVERS = (
    "src/gpupool/portal/node_modules",
    "src/gpupool/portal/static/vendor/uPlot.esm.js",
    "src/gpupool/__pycache__/app.cpython-311.pyc",
    "src/gpupool.egg-info",
    ".venv",
    "tests",
)


@dataclass(frozen=True)
class Instruction:
    keyword: str
    flags: dict[str, str]
    args: str

    def exec_form(self) -> list[str]:
        form = json.loads(self.args)
        assert isinstance(form, list), f"{self.keyword} {self.args}: not the exec (JSON) form"
        return [str(word) for word in form]


def parse(text: str) -> list[Instruction]:
    """Instructions as Docker reads them: comment lines dropped (inside a continuation too), lines ending in a
    backslash joined, leading `--name=value` flags split off."""
    logical, pending = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or (not line.strip() and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continuation"
    out = []
    for line in logical:
        keyword, _, rest = line.strip().partition(" ")
        flags = {}
        while (found := re.match(r"--([a-z-]+)=(\S+)\s+", rest.lstrip())) is not None:
            flags[found.group(1)] = found.group(2)
            rest = rest.lstrip()[found.end() :]
        out.append(Instruction(keyword.upper(), flags, rest.strip()))
    return out


def stages() -> list[list[Instruction]]:
    """The instructions of each stage, each list starting with its FROM."""
    result: list[list[Instruction]] = []
    for ins in parse(DOCKERFILE.read_text()):
        if ins.keyword == "FROM":
            result.append([])
        assert result, f"{ins.keyword} before the first FROM"
        result[-1].append(ins)
    return result


def final(keyword: str) -> Instruction:
    """The final stage's last instruction of a kind: the one that counts."""
    return [i for i in stages()[-1] if i.keyword == keyword][-1]


def dockerignored(path: str) -> bool:
    """Whether .dockerignore keeps a context path out: the last pattern matching it or a parent folder wins."""
    excluded = False
    parents = [("/".join(path.split("/")[: n + 1])) for n in range(path.count("/") + 1)]
    for line in (REPO / ".dockerignore").read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negated = pattern.startswith("!")
        body = pattern.removeprefix("!")
        regex = re.escape(body).replace(r"\*\*/", "(.*/)?").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if any(re.fullmatch(regex, p) for p in parents):
            excluded = not negated
    return excluded


def copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY from the build context."""
    found = []
    for stage in stages():
        for ins in stage:
            if ins.keyword == "COPY" and "from" not in ins.flags:
                *sources, destination = shlex.split(ins.args)
                found.append((sources, destination))
    return found


def deployment_container() -> dict[str, object]:
    docs = {d["kind"]: d for d in yaml.safe_load_all(MANIFESTS.read_text()) if d}
    container: dict[str, object] = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    return container


def test_every_stage_starts_from_debian_slim_python_pinned_by_tag() -> None:
    images = [stage[0].args.split()[0] for stage in stages()]
    assert len(images) == 2
    assert images[0] == images[1]  # the wheels are built for the interpreter that installs them
    repository, _, tag = images[1].partition(":")
    assert repository == "python"
    assert re.fullmatch(r"3\.11\.\d+-slim-bookworm", tag), tag  # a patch release on Debian 12's slim image
    assert stages()[0][0].args.split()[-2:] == ["AS", "builder"]


def test_the_final_user_is_the_charts_and_not_root() -> None:
    user, _, group = final("USER").args.partition(":")
    values = yaml.safe_load(VALUES.read_text())["podSecurityContext"]
    assert (int(user), int(group)) == (values["runAsUser"], values["fsGroup"]) == (10001, 10001)


def test_every_copy_source_exists_and_reaches_the_build_context() -> None:
    sources = [s for found, _ in copies() for s in found]
    assert sources == ["pyproject.toml", "README.md", "scripts/build-portal", "src"]
    for source in sources:
        assert (REPO / source).exists(), source
        assert not dockerignored(source), source
    # What a local build leaves behind stays out, even under a source that goes in.
    for leftover in LEFTOVERS:
        assert dockerignored(leftover), leftover
    # The only other source: the builder stage's wheels, by its name.
    mounts = [i.flags["mount"] for i in stages()[-1] if i.keyword == "RUN" and "mount" in i.flags]
    assert mounts == ["type=bind,from=builder,source=/wheels,target=/wheels"]


def test_it_runs_gpupool_server_on_the_charts_port_and_checks_healthz() -> None:
    entrypoint, command = final("ENTRYPOINT").exec_form(), final("CMD").exec_form()
    container = deployment_container()
    # The chart and the manifests give only args: they follow this entrypoint, as CMD does.
    assert entrypoint == ["gpupool"]
    assert command[0] == "server" == container["args"][0]  # type: ignore[index]
    port = command[command.index("--port") + 1]
    assert port == final("EXPOSE").args == "8470"
    assert container["ports"] == [{"name": "http", "containerPort": int(port)}]
    assert yaml.safe_load(VALUES.read_text())["service"]["port"] == int(port)
    check = final("HEALTHCHECK")
    assert check.args.startswith("CMD ")
    probe = json.loads(check.args.removeprefix("CMD "))
    assert probe[:2] == ["python", "-c"] and f"'http://127.0.0.1:{port}/healthz'" in probe[2]
    assert check.flags == {"interval": "30s", "timeout": "5s", "start-period": "30s", "retries": "3"}


def test_the_image_installs_the_builders_wheel_with_the_server_extras() -> None:
    builder, image = stages()
    runs = [i.args for i in builder if i.keyword == "RUN"]
    assert runs[1:] == ["scripts/build-portal", f'pip wheel --no-cache-dir --wheel-dir /wheels ".{EXTRAS}"']
    installs = [i.args for i in image if i.keyword == "RUN" and "pip install" in i.args]
    assert installs == [f'pip install --no-cache-dir --no-index --find-links /wheels "gpupool{EXTRAS}"']


@pytest.mark.packaging
def test_the_builder_stages_steps_make_a_wheel_with_the_portals_assets(tmp_path: Path) -> None:
    """The build context as .dockerignore makes it, laid out as the COPYs do; then the builder's RUN steps."""
    context = tmp_path / "src"
    for sources, destination in copies():
        for source in sources:
            target = context / source if destination.endswith("/") else context / destination
            if (REPO / source).is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / source, target)
                continue
            shutil.copytree(
                REPO / source,
                target,
                ignore=lambda folder, names: [
                    n for n in names if dockerignored(str((Path(folder) / n).relative_to(REPO)))
                ],
            )
    assert not (context / "src/gpupool/portal/node_modules").exists()
    build = subprocess.run([str(context / "scripts/build-portal")], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    # The image's own command builds every dependency's wheel too; gpupool's alone is what is checked here.
    wheels = tmp_path / "wheels"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", "wheel", "--no-deps",
         "--wheel-dir", str(wheels), f".{EXTRAS}"],
        cwd=context, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (wheel,) = wheels.glob("gpupool-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
        metadata = next(z.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    vendor = {"uPlot.esm.js", "uPlot.min.css", "LICENSE"}
    assert {n.rsplit("/", 1)[1] for n in names if n.startswith("gpupool/portal/static/vendor/")} == vendor
    assert re.search(r"^gpupool = gpupool\.", entry_points, re.M)
    extras = set(re.findall(r"^Provides-Extra: (\S+)$", metadata, re.M))
    assert extras >= {"server", "postgres", "kubernetes"}
