"""Where a setting comes from: flags over the environment (GPUPOOL_*) over the secrets dir over the config file
(YAML or TOML) over the defaults; secrets from files, never needing the environment."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpupool.cli.server_cmd import load
from gpupool.settings import ConfigError, Settings

PG = "postgresql://gpupool@127.0.0.1:5432/gpupool"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.upper().startswith("GPUPOOL_"):
            monkeypatch.delenv(name)
    yield


def _file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    "name, text",
    [
        ("gpupool.yaml", "port: 1001\ninterval_s: 3\npool: from-file\ngrace_s: 5\nprices: {default: 2.5}\n"),
        ("gpupool.toml", 'port = 1001\ninterval_s = 3\npool = "from-file"\ngrace_s = 5\nprices = {default = 2.5}\n'),
    ],
)
def test_flags_beat_the_environment_which_beats_the_config_file_which_beats_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str
) -> None:
    config = _file(tmp_path / name, text, 0o644)
    monkeypatch.setenv("GPUPOOL_CONFIG", str(config))
    monkeypatch.setenv("GPUPOOL_PORT", "1002")
    monkeypatch.setenv("GPUPOOL_INTERVAL_S", "4")
    monkeypatch.setenv("GPUPOOL_GRACE_S", "6")
    s = Settings(port=1003, interval_s=7)
    got = (s.port, s.interval_s, s.grace_s, s.pool, s.prices, s.telemetry_interval_s, s.config)
    assert got == (1003, 7.0, 6.0, "from-file", {"default": 2.5}, 5.0, config)


def test_the_flags_config_file_wins_over_the_environments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPOOL_CONFIG", str(_file(tmp_path / "env.yaml", "pool: env-file\n")))
    assert Settings(config=_file(tmp_path / "flag.yaml", "pool: flag-file\n")).pool == "flag-file"


def test_lists_and_mappings_come_from_the_environment_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPOOL_OIDC_ROLES", '["ml=admin", "team=project:vision:member"]')
    monkeypatch.setenv("GPUPOOL_MIN_RUNTIME_S", '{"training": 0}')
    monkeypatch.setenv("GPUPOOL_OIDC_ISSUER", "https://idp.example.org")
    monkeypatch.setenv("GPUPOOL_OIDC_CLIENT_ID", "gpupool")
    s = Settings()
    assert (s.oidc_roles, s.min_runtime_s) == (("ml=admin", "team=project:vision:member"), {"training": 0.0})


def test_variables_of_the_client_and_of_workloads_are_not_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPOOL_URL", "http://elsewhere:1")
    monkeypatch.setenv("GPUPOOL_TOKEN", "gp_x")
    monkeypatch.setenv("GPUPOOL_WORKLOAD", "w1")
    assert Settings().port == 8470


def test_secrets_come_from_the_secrets_dir_and_nothing_else_does(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "..data").mkdir()  # laid out as the kubelet mounts a Secret: links into a versioned folder,
    _file(secrets / "..data" / "db_password", "from-dir\n", 0o440)  # group-readable for the pod's fsGroup
    (secrets / "db_password").symlink_to("..data/db_password")
    _file(secrets / "session_secret", "k" * 40)
    _file(secrets / "port", "1")  # not a secret: not read from here
    s = Settings(db_url=PG, secrets_dir=secrets)
    assert s.db_password is not None and s.db_password.get_secret_value() == "from-dir"
    assert s.session_secret is not None and s.session_secret.get_secret_value() == "k" * 40
    assert s.port == 8470
    assert "from-dir" not in repr(s)


def test_the_environment_beats_the_secrets_dir_which_beats_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    _file(secrets / "db_password", "from-dir")
    config = _file(tmp_path / "c.yaml", f"db_url: {PG}\ndb_password: from-file\nsecrets_dir: {secrets}\n")
    assert Settings(config=config).database_url == PG.replace("gpupool@", "gpupool:from-dir@")
    monkeypatch.setenv("GPUPOOL_DB_PASSWORD", "from-env")
    assert Settings(config=config).database_url == PG.replace("gpupool@", "gpupool:from-env@")
    (secrets / "db_password").unlink()
    monkeypatch.delenv("GPUPOOL_DB_PASSWORD")
    assert Settings(config=config).database_url == PG.replace("gpupool@", "gpupool:from-file@")


def test_a_secret_file_setting_reads_the_secret(tmp_path: Path) -> None:
    oidc = _file(tmp_path / "oidc", "client-secret\n")
    session = _file(tmp_path / "session", "s" * 32 + "\n")
    config = _file(tmp_path / "c.toml", f'oidc_client_secret_file = "{oidc}"\n', 0o644)
    s = Settings(config=config, oidc_issuer="https://idp.example.org", oidc_client_id="gpupool",
                 session_secret_file=session)  # fmt: skip
    assert s.oidc_client_secret is not None and s.oidc_client_secret.get_secret_value() == "client-secret"
    assert s.session_secret is not None and s.session_secret.get_secret_value() == "s" * 32


def test_loading_takes_secrets_out_of_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPOOL_DB_PASSWORD", "hunter2")
    monkeypatch.setenv("GPUPOOL_SESSION_SECRET", "x" * 32)
    monkeypatch.setenv("GPUPOOL_POOL", "a")
    s = load({"db_url": PG})
    assert s.db_password is not None and s.session_secret is not None and s.pool == "a"
    assert ("GPUPOOL_DB_PASSWORD" in os.environ, "GPUPOOL_SESSION_SECRET" in os.environ) == (False, False)
    assert os.environ["GPUPOOL_POOL"] == "a"


def _error(**given: object) -> str:
    with pytest.raises((ValidationError, ConfigError)) as got:
        Settings(**given)
    e = got.value
    if isinstance(e, ValidationError):
        return "; ".join(str(err["msg"]).removeprefix("Value error, ") for err in e.errors())
    return str(e)


def test_a_secrets_dir_file_every_user_can_read_is_refused(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    _file(secrets / "db_password", "pw", 0o644)
    with pytest.raises(Exception) as got:
        Settings(db_url=PG, secrets_dir=secrets)
    assert str(got.value.__cause__) == (
        f"secrets_dir {secrets / 'db_password'}: mode 644 lets every user read it; chmod o-rwx it"
    )


def test_a_short_session_secret_is_refused(tmp_path: Path) -> None:
    path = _file(tmp_path / "s", "short")
    assert _error(session_secret_file=path) == "a session secret has 32 to 1024 characters"


def test_every_flag_of_the_command_sets_a_setting() -> None:
    import inspect

    from gpupool.cli.server_cmd import FIELDS, server

    assert sorted(FIELDS) == sorted(p for p in inspect.signature(server).parameters if p != "ctx")
    assert sorted(set(FIELDS.values()) - set(Settings.model_fields)) == []
