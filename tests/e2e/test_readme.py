"""Every shell command of README.md, run as printed, in order, on a fresh machine's defaults: the quick start's
server (the block marked `<!-- readme: server -->`) started in the background on a fresh home directory, each
other command through bash in an empty directory, where the README itself creates the files it runs. Each exits
0, and where the README shows output, the output is the one shown.

Blocks marked `<!-- readme: skip -->` are not run (installing, the whole suite, traces that are not in a clone).
Shown output is compared line by line after what differs from run to run is set aside: `…` in the README stands
for any text (a token), timestamps and ages are compared as such, and runs of spaces or rules as one (a table's
widths follow its ages). A command that only reads (list, describe, logs, nodes, open) is asked again until its
output matches, as a person running the quick start would see it settle, within a deadline. The home
directory reads as `~`, as the README writes it, and the node, named for its host, as the README's host `vm`.

To re-record the README: `README_RECORD=transcript.txt pytest tests/e2e/test_readme.py -k as_printed` writes
what each command printed, checking only the exit codes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import uids
from tests.e2e.conftest import GPUPOOL, wait_for

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = re.compile(r"<!--\s*readme:\s*(skip|server)\b.*-->")
FENCE = re.compile(r"^```(\w*)\s*$")
SHELLS = ("bash", "console", "sh", "shell")
READS = ("list", "describe", "logs", "nodes", "open", "whoami")
RECORDED_HOST = "vm"
SETTLE_S = 60.0
"""How long a read-only command is asked again for its output to match (workloads starting, environments built)."""


@dataclass
class Command:
    line: str
    shown: list[str] = field(default_factory=list)


@dataclass
class Block:
    number: int
    mark: str | None
    commands: list[Command]


def _commands(lines: list[str], console: bool) -> list[Command]:
    """A console block's `$ ` lines with the output under each (a heredoc's lines belong to its command); a bash
    block's lines, comments and continuations as bash reads them, are one command each."""
    if not console:
        script = "\n".join(line for line in lines if line.strip())
        return [Command(script)] if script else []
    out: list[Command] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.startswith("$ "):
            if out:
                out[-1].shown.append(line)
            continue
        text = line[2:]
        heredoc = re.search(r"<<-?\s*'?(\w+)'?", text)
        if heredoc:
            while i < len(lines):
                text += "\n" + lines[i]
                i += 1
                if lines[i - 1].strip() == heredoc.group(1):
                    break
        out.append(Command(text))
    return out


def blocks(text: str) -> list[Block]:
    found: list[Block] = []
    mark: str | None = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = MARKER.search(lines[i])
        if m:
            mark = m.group(1)
        fence = FENCE.match(lines[i])
        if fence and fence.group(1):
            lang, start = fence.group(1), i + 1
            i = start
            while not lines[i].startswith("```"):
                i += 1
            if lang in SHELLS:
                found.append(Block(len(found), mark, _commands(lines[start:i], lang == "console")))
            mark = None
        i += 1
    return found


_SQUEEZE = [
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d(?::\d\d)?"), "<time>"),
    (re.compile(r"(?<![\w.])\d+(?:d|h|m|s)(?:\d+(?:h|m|s))*(?![\w.])"), "<age>"),
    (re.compile(r" +"), " "),
    (re.compile(r"([━─═])\1+"), r"\1"),
]


def squeeze(line: str) -> str:
    for pattern, to in _SQUEEZE:
        line = pattern.sub(to, line)
    return line.rstrip()


def matches(shown: list[str], actual: str, home: Path | None = None) -> bool:
    if home is not None:
        actual = actual.replace(str(home), "~")
    host = socket.gethostname()
    if host != RECORDED_HOST:
        actual = re.sub(rf"(?<![\w.-]){re.escape(host)}(?![\w.-])", RECORDED_HOST, actual)
    got = [squeeze(line) for line in actual.rstrip("\n").splitlines()]
    want = [squeeze(line) for line in shown]
    return len(got) == len(want) and all(
        re.fullmatch(".*".join(map(re.escape, w.split("…"))), g) for w, g in zip(want, got, strict=True)
    )


def test_the_readme_blocks_are_marked_and_parsed() -> None:
    found = blocks(README.read_text())
    assert [b.mark for b in found if b.mark] == ["skip", "skip", "server", "skip"]
    servers = [b for b in found if b.mark == "server"]
    assert [c.line for c in servers[0].commands] == ["gpupool server"]
    assert matches(["│ a   │ 3s  │", "token: gp_…"], "│ a │ 12m │\ntoken: gp_x1y2\n")
    assert not matches(["│ a   │ 3s  │"], "│ b │ 3s │\n")


def test_the_readme_server_is_the_one_scripts_start_runs() -> None:
    """The quick start's transcript is what `./scripts/start` gives: it runs `gpupool server` with no flag of its
    own (a root server; otherwise --single-user, which the README says), so the README's server, on its defaults, is
    the one a new user starts (the simulated GPUs' count above all: the transcript's half-GPU job waits on two)."""
    script = (README.parent / "scripts" / "start").read_text()
    runs = re.findall(r"^\s*exec \.venv/bin/gpupool server(.*)$", script, re.MULTILINE)
    assert [r.strip() for r in runs] == ['"$@"', '--single-user "$@"']


def _env(home: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "XDG_"))}
    venv = str(Path(GPUPOOL).parent)
    # GPUPOOL_UID_BASE: a root server claims a uid range of its own on this host, one no other test server uses.
    return keep | {"HOME": str(home), "PATH": f"{venv}:{keep.get('PATH', '')}", "COLUMNS": "100",
                   "GPUPOOL_UID_BASE": str(uids.next_base()),
                   "VIRTUAL_ENV": str(Path(venv).parent)}  # fmt: skip


def _run(command: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-eo", "pipefail", "-c", command], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def _ready(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.mark.timeout(600)
def test_every_readme_command_runs_as_printed(tmp_path: Path) -> None:
    found = blocks(README.read_text())
    home = tmp_path / "home"
    home.mkdir()
    assert not _ready(8470), "something else listens on 8470, the quick start's port"
    env = _env(home)
    work = tmp_path / "work"
    work.mkdir()
    server = next(b for b in found if b.mark == "server")
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["bash", "-c", f"exec {server.commands[0].line}"], env=env, cwd=work, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        shown = server.commands[0].shown
        # Its start is told when it says where the API is: every line up to that one is what the README shows.
        wait_for(lambda: proc.poll() is not None or "gpupool: API on " in log.read_text(), 120, "the server's start")
        assert proc.poll() is None, log.read_text()
        lines = log.read_text().splitlines()
        started = "\n".join(lines[: next(i for i, line in enumerate(lines) if line.startswith("gpupool: API on ")) + 1])
        if os.environ.get("README_RECORD"):
            Path(os.environ["README_RECORD"]).write_text(started + "\n")
        else:
            assert matches(shown, started, home), f"the server printed:\n{started}\nthe README shows:\n" + "\n".join(
                shown
            )
        wait_for(lambda: _ready(8470), 60, "the API on 8470")
        for block in found:
            if block.mark is not None:
                continue
            for command in block.commands:
                _check(command, env, work, home)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        _stop_workloads(home)


def _check(command: Command, env: dict[str, str], cwd: Path, home: Path) -> None:
    record = os.environ.get("README_RECORD")
    if record:
        done = _run(command.line, env, cwd)
        with open(record, "a") as out:
            out.write(f"$ {command.line}\n{done.stdout}")
        assert done.returncode == 0, f"$ {command.line}\nexit {done.returncode}\n{done.stderr}{done.stdout}"
        return
    reads = re.match(r"gpupool (\w+)", command.line)
    retry = bool(command.shown) and reads is not None and reads.group(1) in READS
    deadline = time.monotonic() + (SETTLE_S if retry else 0)
    while True:
        done = _run(command.line, env, cwd)
        ok = done.returncode == 0 and (not command.shown or matches(command.shown, done.stdout, home))
        if ok or time.monotonic() >= deadline:
            break
        time.sleep(0.5)  # a person's pause before asking again; the deadline bounds it
    assert done.returncode == 0, f"$ {command.line}\nexit {done.returncode}\n{done.stderr}{done.stdout}"
    assert not command.shown or matches(command.shown, done.stdout, home), (
        f"$ {command.line}\nprinted:\n{done.stdout}\nthe README shows:\n" + "\n".join(command.shown)
    )


def _stop_workloads(home: Path) -> None:
    """Whatever the quick start left running (the server's own stop ends its workloads; this is for a crash)."""
    run = home / ".local" / "share" / "gpupool" / "run"
    for rec in run.glob("*.json") if run.is_dir() else ():
        with contextlib.suppress(OSError, ValueError, KeyError):
            os.killpg(int(json.loads(rec.read_text())["pid"]), signal.SIGKILL)
    # The quick start's volume stays mounted when its server stops (as on a real host, for the next start); here
    # its loop device goes with the home directory (the kernel has few).
    with open("/proc/self/mounts") as mounts:
        under = [line.split()[1] for line in mounts if line.split()[1].startswith(str(home))]
    for point in sorted(under, reverse=True):
        subprocess.run(["umount", "-l", point], check=False)
    shutil.rmtree(home, ignore_errors=True)
