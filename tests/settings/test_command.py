"""`gpupool server` reads its settings from flags, the environment and a config file (a real process); a bad
config stops it with one clear line and exit status 2, never a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import GPUPOOL, free_port, wait_for


def _env(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")} | extra


def _file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def refused(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run `gpupool server` expecting a refusal: exit 2, one line on stderr, no traceback. Returns that line."""
    cmd = [GPUPOOL, "server", "--data-dir", str(tmp_path / "data"), "--single-user", "--gpus", "fake:1xH100-80GB"]
    done = subprocess.run([*cmd, *args], capture_output=True, text=True, env=_env(**(env or {})), timeout=120)
    assert (done.returncode, done.stdout, done.stderr.count("\n")) == (2, "", 1), done.stderr
    return done.stderr


def test_flags_beat_the_environment_which_beats_the_config_file(tmp_path: Path) -> None:
    data, log = tmp_path / "from-config", tmp_path / "server.log"
    port = free_port()
    config = _file(tmp_path / "gpupool.yaml", f"data_dir: {data}\nport: 1\ngpus: fake:2xH100-80GB\nsingle_user: true\n")
    env = _env(GPUPOOL_CONFIG=str(config), GPUPOOL_GPUS="fake:1xA100-40GB", GPUPOOL_PORT="2")
    with log.open("wb") as out:
        proc = subprocess.Popen([GPUPOOL, "server", "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:

        def answers() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(answers, 60, "the server to answer on the flag's port")
        first = log.read_text().splitlines()[0]
        assert first == f"gpupool: 1 GPU (simulated: 1× A100), store sqlite:///{data / 'gpupool.db'}"
        assert (data / "admin-token").is_file()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)


def test_an_unknown_key_or_a_wrong_type_in_the_config_file(tmp_path: Path) -> None:
    config = _file(tmp_path / "c.yaml", "dbb_url: sqlite:///x\nport: nine\n", 0o644)
    assert refused(tmp_path, "--config", str(config)) == (
        "error: port (--port, GPUPOOL_PORT): Input should be a valid integer, unable to parse string as an integer; "
        "dbb_url: no such setting (did you mean db_url?)\n"
    )


@pytest.mark.parametrize(
    "name, text, says",
    [
        ("c.ini", "port = 1\n", "name it .yaml, .yml or .toml (its suffix says how to read it)"),
        ("c.yaml", "- port\n", "expected a mapping of setting names to values at the top"),
        ("c.yaml", "config: other.yaml\n", "a config file cannot name another (config)"),
        ("c.toml", 'port = "1"\nport = 2\n', "not valid TOML: Cannot overwrite a value (at line 2, column 9)"),
    ],
)
def test_a_config_file_that_cannot_be_read_as_settings(tmp_path: Path, name: str, text: str, says: str) -> None:
    config = _file(tmp_path / name, text, 0o644)
    assert refused(tmp_path, "--config", str(config)) == f"error: config file {config}: {says}\n"


def test_a_missing_config_file_from_the_environment(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    err = refused(tmp_path, env={"GPUPOOL_CONFIG": str(missing)})
    assert err == f"error: config file {missing}: No such file or directory\n"


def test_a_config_file_holding_a_secret_must_be_its_owners_alone(tmp_path: Path) -> None:
    config = _file(tmp_path / "c.yaml", "db_url: postgresql://u@127.0.0.1:1/db\ndb_password: pw\n", 0o640)
    assert refused(tmp_path, "--config", str(config)) == (
        f"error: config file {config}: holds db_password but mode 640 lets others read it; chmod 600 it\n"
    )


def test_a_list_setting_in_the_environment_that_is_not_json(tmp_path: Path) -> None:
    err = refused(tmp_path, env={"GPUPOOL_PRICES": "default=2"})
    assert err == "error: GPUPOOL_PRICES: not valid JSON (a list or mapping setting takes JSON in the environment)\n"


def test_missing_secret_files_and_dirs(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    err = refused(tmp_path, "--oidc-issuer", "https://idp.example.org", "--oidc-client-id", "gpupool",
                  "--oidc-client-secret-file", str(missing))  # fmt: skip
    assert err == f"error: --oidc-client-secret-file {missing}: No such file or directory\n"
    assert refused(tmp_path, "--secrets-dir", str(missing)) == f"error: secrets_dir {missing}: not a directory\n"


def test_a_secret_given_twice_is_refused(tmp_path: Path) -> None:
    path = _file(tmp_path / "session-secret", "s" * 32)
    err = refused(tmp_path, "--session-secret-file", str(path), env={"GPUPOOL_SESSION_SECRET": "e" * 32})
    assert err == (
        "error: the session secret is given twice: set GPUPOOL_SESSION_SECRET or give --session-secret-file, not both\n"
    )
