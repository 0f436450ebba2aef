"""The CLI as people expect it, against a real server: every flag of submit, human durations, contexts and a default
project, a list that never cuts a name at 80 columns and refreshes until Ctrl-C, the end of a failed job's log in
describe, logs of a pending job that say why, --version and shell completion; bad input is one line, exit 2.

On SQLite only: the CLI reaches the store through the API, whose store paths the API and lifecycle tests run on
PostgreSQL too. Tests share one server (each in a project of its own, its live work cancelled after it) unless
they need the GPUs to themselves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.cells import cell_len

from tests.e2e.conftest import GPUPOOL, Server, Servers, wait_for

LONG = "a-very-long-workload-name-of-sixty-three-characters-0123456789a"


EMPTY = tempfile.mkdtemp(prefix="gpupool-cli-")


def run(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    # In an empty directory, which a submit sends as the job's code (not the repository the tests run from).
    return subprocess.run([GPUPOOL, *args], env=env, capture_output=True, text=True, timeout=60, input=stdin, cwd=EMPTY)


def cli_env(s: Server, **extra: str) -> dict[str, str]:
    return s.env | {"GPUPOOL_URL": s.url, "GPUPOOL_TOKEN": s.admin_token} | extra


@pytest.fixture
def db_url() -> None:
    """SQLite (see the module's note): overrides conftest's SQLite-and-PostgreSQL parametrisation."""
    return None


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    servers = Servers(tmp_path_factory.mktemp("cli-habits"))
    yield servers.start(None, "fake:4xH100-80GB,1xL4-24GB", ())
    servers.close()


@pytest.fixture
def s(shared: Server) -> Iterator[Server]:
    """The shared server, its live workloads cancelled after the test (their GPUs free for the next)."""
    yield shared
    with shared.client() as c:
        for w in c.list_workloads():
            if w.state in ("pending", "starting", "running", "suspended"):
                c.cancel(w.name, w.project)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("submit", "--type", "tpu", "--", "true"), "error: --type 'tpu': expected one of notebook, training, "
         "inference, batch"),
        (("submit", "--priority", "urgent", "--", "true"), "error: --priority 'urgent': expected one of production, "
         "training, interactive, batch"),
        (("submit", "--max-duration", "3x", "--", "true"), "error: Invalid value for '--max-duration': '3x' is not a "
         "duration (like 30m, 1h30m, 3d, 90s or seconds) (see gpupool submit --help)"),
        (("submit", "--max-duration", "30m1h", "--", "true"), "error: Invalid value for '--max-duration': '30m1h' is "
         "not a duration: give each unit once, largest first (like 1h30m) (see gpupool submit --help)"),
        (("project", "policy", "vision", "--idle-timeout", "notebook=soon"), "error: --idle-timeout 'notebook=soon': "
         "'soon' is not a duration (like 30m, 1h30m, 3d, 90s or seconds)"),
        (("list", "--state", "done"), "error: --state 'done' is not a state; the states: pending, starting, running, "
         "preempted, suspended, succeeded, failed, cancelled"),
        (("submit", "--retry", "sometimes", "--", "true"), "error: --retry 'sometimes': expected one of on-failure, "
         "on-preemption, always"),
        (("list", "--xyzzy"), "error: No such option: --xyzzy (see gpupool list --help)"),
        (("server", "--grace", "3x"), "error: Invalid value for '--grace': '3x' is not a duration (like 30m, 1h30m, "
         "3d, 90s or seconds) (see gpupool server --help)"),
        (("config", "set", "colour", "red"), "error: 'colour': expected one of url, token, project"),
        (("submit", "--volume", "data", "--", "true"), "error: --volume 'data': expected NAME:/path or NAME:/path:ro"),
    ],
)  # fmt: skip
def test_bad_choices_and_durations_are_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")} | {"XDG_CONFIG_HOME": str(tmp_path)}
    done = run(env, *args)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", message + "\n")


def test_version_and_shell_completion(tmp_path: Path) -> None:
    from gpupool import __version__

    env = os.environ | {"XDG_CONFIG_HOME": str(tmp_path)}
    assert run(env, "--version").stdout == f"gpupool {__version__}\n"
    # Typer's own switch: the shell named, not detected from the parents (under CI, no shell is among them).
    script = run(env | {"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}, "--show-completion", "bash")
    assert script.returncode == 0 and "_GPUPOOL_COMPLETE=complete_bash" in script.stdout
    # What bash asks the script for when the user types `gpupool con<TAB>`.
    asked = env | {"_GPUPOOL_COMPLETE": "complete_bash", "COMP_WORDS": "gpupool con", "COMP_CWORD": "1"}
    assert run(asked).stdout.split() == ["config"]


def test_submit_takes_every_field_with_human_durations_and_an_env_file(s: Server, tmp_path: Path) -> None:
    s.cli("project", "create", "vision", "--deserved-gpus", "2")
    env_file = tmp_path / "run.env"
    env_file.write_text('# for the run\nLR=0.1\nexport EPOCHS=3\nTAG="a b"\n\nSEED=1\n')
    s.cli("submit", "-p", "vision", "--name", "full", "--gpu", "0.5", "--cpu", "0.5", "--memory", "1GiB",
          "--pool", "default", "--priority", "interactive", "--max-duration", "3d", "--grace", "1m30s",
          "--env-file", str(env_file), "--env", "SEED=2", "--", "sh", "-c",
          "echo $LR $EPOCHS $TAG $SEED; sleep 600")  # fmt: skip
    d = s.workload("full")
    assert (d["priority"], d["max_duration_s"], d["grace_s"]) == ("interactive", 259200.0, 90.0)
    assert d["env"] == {"LR": "0.1", "EPOCHS": "3", "TAG": "a b", "SEED": "2"}
    assert "declared max duration 3d" in s.cli("describe", "full").stdout
    s.wait_state("full", "running")
    wait_for(lambda: s.cli("logs", "full").stdout == "0.1 3 a b 2\n", 30, "the environment in its output")
    # An apply file names its env file relative to itself; its own env wins.
    (tmp_path / "job.yaml").write_text("project: vision\nname: filed\nenv_file: run.env\nenv: {SEED: '3'}\n"
                                       "command: ['true']\n")  # fmt: skip
    s.cli("apply", "-f", str(tmp_path / "job.yaml"), "--no-code")
    assert s.workload("filed")["env"] == {"LR": "0.1", "EPOCHS": "3", "TAG": "a b", "SEED": "3"}
    # The resources reach the server: an unknown pool and more CPU than any node has are refused there.
    refused = s.cli("submit", "-p", "vision", "--pool", "nowhere", "--", "true", check=False)
    assert (refused.returncode, "nowhere" in refused.stderr) == (1, True)
    refused = s.cli("submit", "-p", "vision", "--cpu", "100000", "--", "true", check=False)
    assert (refused.returncode, "cpu" in refused.stderr.lower()) == (1, True)
    missing = tmp_path / "missing.env"
    bad = s.cli("submit", "-p", "vision", "--env-file", str(missing), "--", "true", check=False)
    assert (bad.returncode, bad.stderr) == (2, f"error: --env-file {missing}: No such file or directory\n")
    env_file.write_text("LR=0.1\nnot a pair\n")
    bad = s.cli("submit", "-p", "vision", "--env-file", str(env_file), "--", "true", check=False)
    assert (bad.returncode, bad.stderr) == (
        2,
        f"error: --env-file {env_file}:2: expected KEY=VALUE, got 'not a pair'\n",
    )


def test_list_shows_every_name_whole_at_80_columns_leaving_columns_out(s: Server) -> None:
    s.cli("project", "create", "listed", "--deserved-gpus", "1")
    names = [LONG, "train-resnet", "nb-1"]
    for name in names:
        s.cli("submit", "-p", "listed", "--name", name, "--gpu", "0.25", "--", "sleep", "600")
    s.wait_state(LONG, "running")
    narrow = run(cli_env(s, COLUMNS="80"), "list", "-p", "listed").stdout.splitlines()
    assert max(cell_len(line) for line in narrow) <= 80
    assert [sum(f"│ {name} " in line for line in narrow) for name in names] == [1, 1, 1]
    assert [h for h in ("NAME", "PROJECT", "STATE", "REASON", "PRIORITY") if f" {h} " in narrow[1]] == ["NAME", "STATE"]
    wide = run(cli_env(s, COLUMNS="220"), "list", "-p", "listed").stdout.splitlines()
    headers = ["NAME", "PROJECT", "OWNER", "TYPE", "PRIORITY", "STATE", "GPUS", "NODE/DEVICES", "REASON", "ETA", "AGE"]
    assert [h for h in headers if f" {h} " in wide[1]] == headers
    assert len(wide) == 3 + len(names) + 1  # one line a row


def test_list_watch_refreshes_until_ctrl_c_and_ends_without_a_traceback(s: Server) -> None:
    s.cli("project", "create", "watching", "--deserved-gpus", "1")
    s.cli("submit", "-p", "watching", "--name", "watched", "--", "sleep", "600")
    # Ctrl-C as a terminal sends it: a run in the background (CI's) would hand it SIGINT ignored, as shells do.
    proc = subprocess.Popen([GPUPOOL, "list", "--watch"], env=cli_env(s), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=EMPTY,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        while sum(line.startswith("every 2s") for line in seen) < 2:  # two refreshes, the second 2 s on
            seen.append(proc.stdout.readline())
            assert seen[-1], f"the watch ended early: {''.join(seen)}"
        assert any("│ watched " in line for line in seen)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert (proc.returncode, err) == (0, "")


def test_describe_of_a_failed_job_shows_the_end_of_its_log(s: Server) -> None:
    s.cli("project", "create", "failing", "--deserved-gpus", "1")
    s.cli("submit", "-p", "failing", "--name", "broken", "--", "sh", "-c", "seq -f 'line %g' 1 30; exit 3")
    s.wait_state("broken", "failed")
    text = s.cli("describe", "broken").stdout
    tail = text.split("Log of member 0 (last 20 lines):\n")[1].splitlines()
    assert tail == [f"  line {i}" for i in range(11, 31)]
    assert s.workload("broken")["exit_code"] == 3


def test_logs_of_a_pending_job_say_it_is_pending_and_why(s: Server) -> None:
    s.cli("project", "create", "waiting", "--deserved-gpus", "4")
    s.cli("submit", "-p", "waiting", "--name", "hog", "--gpus", "4", "--", "sleep", "600")
    s.wait_state("hog", "running")
    s.cli("submit", "-p", "waiting", "--name", "waiter", "--gpus", "4", "--", "echo", "hello")
    reason = wait_for(lambda: s.workload("waiter")["reason_code"] and s.workload("waiter")["reason"], 30, "a reason")
    done = s.cli("logs", "waiter")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", f"waiter is pending, no output yet: {reason}\n")
    # Followed, it says so once, then streams the output once it runs.
    follow = subprocess.Popen([GPUPOOL, "logs", "waiter", "-f"], env=cli_env(s), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert follow.stderr is not None
        note = f"waiter is pending, no output yet: {reason}; its output follows once it starts\n"
        assert follow.stderr.readline() == note
        s.cli("cancel", "hog")
        out, err = follow.communicate(timeout=60)
    finally:
        follow.kill()
    assert (follow.returncode, out, err) == (0, "hello\n", "")


def test_contexts_hold_servers_tokens_and_a_default_project(s: Server, tmp_path: Path) -> None:
    s.cli("project", "create", "ctx-vision", "--deserved-gpus", "1")
    s.cli("project", "create", "ctx-nlp", "--deserved-gpus", "1")
    env = {k: v for k, v in s.env.items() if not k.startswith("GPUPOOL_")} | {"XDG_CONFIG_HOME": str(tmp_path)}
    saved = tmp_path / "gpupool" / "config.json"
    saved.parent.mkdir()
    saved.write_text(json.dumps({"url": "http://127.0.0.1:1", "token": "gp_old"}))  # an older gpupool's file
    saved.chmod(0o644)
    login = run(env, "login", "--url", s.url, "--token", s.admin_token, "--context", "lab")
    assert login.stdout == f"logged in to {s.url} as admin (admin); saved in {saved} (context lab)\n"
    assert saved.stat().st_mode & 0o777 == 0o600
    assert run(env, "config", "set", "project", "ctx-vision").returncode == 0
    # The admin is in no project: the context's default project is where a submit without -p goes.
    assert run(env, "submit", "--name", "ctx-here", "--", "true").returncode == 0
    assert run(env | {"GPUPOOL_PROJECT": "ctx-nlp"}, "submit", "--name", "ctx-there", "--", "true").returncode == 0
    assert [s.workload(n)["project"] for n in ("ctx-here", "ctx-there")] == ["ctx-vision", "ctx-nlp"]
    token = f"{s.admin_token[:4]}…{s.admin_token[-4:]}"
    assert run(env, "config", "get").stdout == (
        f"context: lab\nurl:     {s.url}  (context lab)\ntoken:   {token}  (context lab)\n"
        "project: ctx-vision  (context lab)\n"
    )
    assert run(env, "config", "get", "project").stdout == "ctx-vision\n"
    listed = run(env, "config", "get-contexts", "-o", "json")
    assert json.loads(listed.stdout) == {"current": "lab", "contexts": {
        "default": {"url": "http://127.0.0.1:1", "token": None},
        "lab": {"url": s.url, "token": None, "project": "ctx-vision"},
    }}  # fmt: skip
    # The old server is the default context: selected once, or made current, commands go there.
    assert run(env, "--context", "default", "whoami").returncode == 1
    assert run(env, "config", "use-context", "default").stdout == "current context: default (http://127.0.0.1:1)\n"
    assert run(env, "whoami").returncode == 1
    assert run(env, "--context", "lab", "whoami").stdout == "admin (admin); projects: none\n"
    assert run(env | {"GPUPOOL_CONTEXT": "lab"}, "whoami").stdout == "admin (admin); projects: none\n"
    nowhere = run(env, "--context", "nowhere", "whoami")
    assert (nowhere.returncode, nowhere.stderr) == (2, "error: no context 'nowhere' (contexts: default, lab)\n")
    missing = run(env, "config", "use-context", "nowhere")
    assert (missing.returncode, missing.stderr) == (2, "error: no context 'nowhere' (contexts: default, lab)\n")


def test_the_current_directory_goes_with_the_job_unless_told_otherwise(s: Server, tmp_path: Path) -> None:
    s.cli("project", "create", "coded", "--deserved-gpus", "1")
    here = tmp_path / "project"
    (here / "data").mkdir(parents=True)
    (here / "train.sh").write_text("echo training on $(cat data/set.txt)\n")
    (here / "data" / "set.txt").write_text("cifar\n")
    (here / "secret.env").write_text("TOKEN=x\n")
    (here / ".gitignore").write_text("secret.env\n")
    other = tmp_path / "other"
    other.mkdir()
    (other / "run.sh").write_text("echo from elsewhere\n")
    env = cli_env(s)

    def submit(*args: str) -> None:
        done = subprocess.run([GPUPOOL, "submit", "-p", "coded", *args], env=env, cwd=here, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr

    submit("--name", "here", "--", "sh", "train.sh")
    submit("--name", "dot", "--workdir", ".", "--", "sh", "train.sh")
    submit("--name", "other", "--workdir", str(other), "--", "sh", "run.sh")
    submit("--name", "none", "--no-code", "--", "true")
    shown = {n: s.workload(n) for n in ("here", "dot", "other", "none")}
    # Only what .gitignore lets through: train.sh, data/set.txt and .gitignore itself.
    assert [(w["code_files"], w["code_bytes"]) for w in shown.values()] == [(3, 54), (3, 54), (1, 20), (None, None)]
    assert shown["none"]["code"] is None and shown["here"]["code"] == shown["dot"]["code"] != shown["other"]["code"]
    assert f"Code:        {shown['here']['code'][:19]}… (3 files, 54 B)" in s.cli("describe", "here").stdout
    both = s.cli("submit", "-p", "coded", "--workdir", str(other), "--no-code", "--", "true", check=False)
    assert (both.returncode, both.stderr) == (2, "error: --workdir and --no-code: give one or the other\n")
    # A YAML file's workdir is relative to the file.
    spec = tmp_path / "job.yaml"
    spec.write_text("project: coded\nname: from-yaml\nworkdir: other\ncommand: [sh, run.sh]\n")
    s.cli("apply", "-f", str(spec))
    assert s.workload("from-yaml")["code"] == shown["other"]["code"]


def test_a_failing_job_retried_twice_shows_its_attempts(s: Server) -> None:
    s.cli("project", "create", "retrying", "--deserved-gpus", "1")
    s.cli("submit", "-p", "retrying", "--name", "flaky", "--retry", "on-failure", "--max-retries", "2",
          "--retry-backoff", "0s", "--", "sh", "-c", "echo try; exit 4")  # fmt: skip
    wait_for(lambda: s.workload("flaky")["state"] == "failed" and len(s.workload("flaky")["attempts"]) == 3, 60,
             "three failed attempts")  # fmt: skip
    text = s.cli("describe", "flaky").stdout
    attempts = text.split("Attempts:\n")[1].split("Isolation:")[0].splitlines()
    assert [line.split(",")[0] for line in attempts] == ["  1   failed (exit 4)", "  2   failed (exit 4)",
                                                         "  3   failed (exit 4)"]  # fmt: skip
    assert [line.endswith("; retried") for line in attempts] == [True, True, False]
    alone = s.cli("submit", "-p", "retrying", "--max-retries", "2", "--", "true", check=False)
    assert (alone.returncode, alone.stderr) == (
        2, "error: --max-retries and --retry-backoff go with --retry on-failure, on-preemption or always\n",
    )  # fmt: skip


def test_gpu_models_owners_and_what_describe_shows(s: Server, tmp_path: Path) -> None:
    s.cli("project", "create", "owned", "--deserved-gpus", "1")
    created = s.cli("user", "create", "ana", "--project", "owned").stdout
    ana = created.split("token (shown once): ")[1].strip()
    s.cli("submit", "-p", "owned", "--name", "by-admin", "--gpu-model", "H100", "--gpu-model", "L4", "--cpu", "0.5",
          "--memory", "512MiB", "--pool", "default", "--", "sleep", "600")  # fmt: skip
    s.cli("submit", "-p", "owned", "--name", "by-ana", "--gpu", "0.25", "--", "sleep", "600", token=ana)
    assert s.workload("by-admin")["gpu_models"] == ["H100", "L4"]
    refused = s.cli("submit", "-p", "owned", "--gpu-model", "TPU", "--", "true", check=False)
    assert (refused.returncode, "TPU" in refused.stderr) == (1, True)

    def names(*args: str, token: str | None = None) -> list[str]:
        return [w["name"] for w in s.json("list", "-p", "owned", *args, token=token)]

    assert (names(), names("--user", "ana"), names("--mine"), names("--mine", token=ana)) == (
        ["by-ana", "by-admin"], ["by-ana"], ["by-admin"], ["by-ana"],
    )  # fmt: skip
    both = s.cli("list", "--mine", "--user", "ana", check=False)
    assert (both.returncode, both.stderr) == (2, "error: --mine and --user: give one or the other\n")
    table = run(cli_env(s, COLUMNS="160"), "list", "-p", "owned").stdout.splitlines()
    assert [line.split("│")[3].strip() for line in table if line.startswith("│")] == ["ana", "admin"]
    # An image no registry here serves: the run fails, but describe still says what it asked for.
    s.cli("submit", "-p", "owned", "--name", "imaged", "--image", "busybox:1", "--no-code", "--", "true")
    assert "Image:       busybox:1" in s.cli("describe", "imaged").stdout.splitlines()
    text = s.cli("describe", "by-admin").stdout.splitlines()
    assert "Project:     owned, submitted by admin" in text
    assert "Resources:   cpu 0.5; memory 512 MiB; pool default; GPU models H100, L4" in text
    # apply: resources as a block, a GPU model alone; the same file again is a no-op, a changed one needs --force.
    spec = tmp_path / "job.yaml"
    spec.write_text("project: owned\nname: applied\nresources:\n  gpu: 0.25\n  gpu_model: H100\n"
                    "command: [sleep, '600']\n")  # fmt: skip
    first = s.cli("apply", "-f", str(spec), "--no-code").stdout
    d = s.workload("applied")
    assert first.startswith(f"workload applied created (id {d['id']}): ")
    assert (d["gpu_models"], d["gpu_milli"]) == (["H100"], 250)
    again = s.cli("apply", "-f", str(spec), "--no-code").stdout
    assert again.startswith(f"workload applied unchanged (id {d['id']}, ")
    spec.write_text(spec.read_text().replace("gpu: 0.25", "gpu: 0.5"))
    changed = s.cli("apply", "-f", str(spec), "--no-code", check=False)
    assert (changed.returncode, changed.stderr.endswith(f"(`gpupool apply -f {spec} --force` replaces it)\n")) == (
        1, True,
    )  # fmt: skip
    forced = s.cli("apply", "-f", str(spec), "--no-code", "--force").stdout
    new = s.workload("applied")
    assert forced.startswith(f"workload applied replaced: id {d['id']} stopped, id {new['id']} ")
    assert new["gpu_milli"] == 500
