"""`gpupool server` at its edges: HTTPS with a certificate, no plain HTTP beyond loopback unless asked, and a
database password that never travels on a command line (tried on a real PostgreSQL that checks it)."""

from __future__ import annotations

import os
import secrets
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg import sql

from tests.e2e.conftest import GPUPOOL, Server, Servers, wait_for
from tests.e2e.postgres import Postgres

GPUS = "fake:1xH100-80GB"


def refused(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run `gpupool server` expecting a refusal: exit 2, one line on stderr, no traceback. Returns that line."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")} | (env or {})
    cmd = [GPUPOOL, "server", "--data-dir", str(tmp_path / "data"), "--single-user", "--gpus", GPUS, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=clean, timeout=120)
    assert (done.returncode, done.stdout.count("\n"), done.stderr.count("\n")) == (2, 0, 1), done.stderr
    return done.stderr


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    s = Servers(tmp_path)
    yield s
    s.close()


# -- TLS ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tls")
    cert, key = root / "cert.pem", root / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def test_with_a_certificate_the_server_speaks_https_only(servers: Servers, certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    s = servers.start(None, GPUS, ("--single-user", "--tls-cert", str(cert), "--tls-key", str(key)))
    trusted = ssl.create_default_context(cafile=str(cert))
    r = httpx.get(f"https://127.0.0.1:{s.port}/healthz", verify=trusted, timeout=10)
    assert (r.status_code, r.json()["status"]) == (200, "ok")
    with httpx.Client(verify=trusted, timeout=10) as c:
        projects = c.get(
            f"https://127.0.0.1:{s.port}/api/v1/projects", headers={"Authorization": f"Bearer {s.admin_token}"}
        )
    assert (projects.status_code, projects.json()) == (200, [])
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.get(f"http://127.0.0.1:{s.port}/healthz", timeout=10)
    assert f"gpupool: API on https://127.0.0.1:{s.port}  (docs at /docs)\n" in s.log()


def test_a_certificate_without_its_key_is_refused(tmp_path: Path, certificate: tuple[Path, Path]) -> None:
    cert, _ = certificate
    err = refused(tmp_path, "--tls-cert", str(cert))
    assert err == "error: --tls-cert and --tls-key go together: give both, or neither\n"


def test_a_key_that_is_not_one_is_refused_before_anything_starts(
    tmp_path: Path, certificate: tuple[Path, Path]
) -> None:
    cert, _ = certificate
    garbage = tmp_path / "key.pem"
    garbage.write_text("not a key\n")
    err = refused(tmp_path, "--tls-cert", str(cert), "--tls-key", str(garbage))
    assert err.startswith(f"error: --tls-cert {cert} / --tls-key {garbage}: cannot load them (PEM, key unencrypted): ")
    assert not (tmp_path / "data").exists()


def test_plain_http_beyond_loopback_is_refused_unless_asked_for(tmp_path: Path, servers: Servers) -> None:
    err = refused(tmp_path, "--host", "0.0.0.0")
    assert err == (
        "error: --host 0.0.0.0: refusing to serve plain HTTP beyond this machine (tokens would cross the network "
        "in clear). Give --tls-cert and --tls-key, or --insecure-http where TLS ends in front of the server\n"
    )
    s = servers.start(None, GPUS, ("--single-user", "--host", "0.0.0.0", "--insecure-http"))
    assert httpx.get(f"http://127.0.0.1:{s.port}/healthz", timeout=10).status_code == 200
    assert "gpupool: --insecure-http: plain HTTP on 0.0.0.0; tokens cross the network in clear" in s.log()


# -- the database password --------------------------------------------------------------------------------

NO_PASSWORD_ON_THE_COMMAND_LINE = (
    "error: --db must not contain a password (a command line is visible to every user of the host): put it in "
    "the environment variable GPUPOOL_DB_PASSWORD, or in a file only you can read (mode 600) and give "
    "--db-password-file PATH\n"
)


@pytest.mark.parametrize(
    "url",
    ["postgresql://gpupool:hunter2@127.0.0.1:1/gpupool", "postgresql://gpupool@127.0.0.1:1/gpupool?password=hunter2"],
)
def test_a_database_url_with_a_password_is_refused_without_echoing_it(tmp_path: Path, url: str) -> None:
    assert refused(tmp_path, "--db", url) == NO_PASSWORD_ON_THE_COMMAND_LINE


def test_a_sqlite_synchronous_it_does_not_know_is_refused(tmp_path: Path) -> None:
    err = refused(tmp_path, "--db", f"sqlite:///{tmp_path}/store.db?synchronous=sometimes")
    assert err == "error: --db: synchronous=sometimes: expected one of normal, full\n"


def test_a_password_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "db-password"
    path.write_text("hunter2\n")
    path.chmod(0o640)
    err = refused(tmp_path, "--db", "postgresql://gpupool@127.0.0.1:1/gpupool", "--db-password-file", str(path))
    assert err == f"error: --db-password-file {path}: mode 640 lets others read it; chmod 600 it\n"


def test_a_password_given_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "db-password"
    path.write_text("hunter2\n")
    path.chmod(0o600)
    args = ("--db", "postgresql://gpupool@127.0.0.1:1/gpupool", "--db-password-file", str(path))
    err = refused(tmp_path, *args, env={"GPUPOOL_DB_PASSWORD": "hunter2"})
    assert err == (
        "error: the database password is given twice: set GPUPOOL_DB_PASSWORD or give --db-password-file, not both\n"
    )


PASSWORD = "s3cr:t@/p%w " + secrets.token_hex(8)  # characters a URL would have to escape


@pytest.fixture(scope="module")
def guarded_db(postgres: Postgres) -> str:
    """A role that must give its password (scram-sha-256: no trust for it), owning a database of its own.
    Returns the database URL, without the password."""
    role = f"gpupool_pw_{secrets.token_hex(4)}"
    admin = f"host=127.0.0.1 port={postgres.port} user=postgres dbname=postgres"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(PASSWORD)))
        c.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(role), sql.Identifier(role)))
        hba = Path(str(c.execute("SHOW hba_file").fetchone()[0]))  # type: ignore[index]
        hba.write_text(f"host all {role} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        c.execute("SELECT pg_reload_conf()")

    def checks_passwords() -> bool:
        try:
            psycopg.connect(f"host=127.0.0.1 port={postgres.port} user={role} dbname={role} password=wrong").close()
        except psycopg.OperationalError:
            return True
        return False

    wait_for(checks_passwords, 30, "PostgreSQL to ask the role for its password")
    return f"postgresql://{role}@127.0.0.1:{postgres.port}/{role}"


def _cmdline(s: Server) -> bytes:
    assert s.proc is not None
    return Path(f"/proc/{s.proc.pid}/cmdline").read_bytes()


def test_the_password_comes_from_the_environment_or_a_file_and_is_never_shown(
    tmp_path: Path, servers: Servers, guarded_db: str
) -> None:
    role = guarded_db.rsplit("/", 1)[1]
    s = Server(tmp_path / "env", guarded_db, GPUS, ("--single-user",))
    s.root.mkdir(exist_ok=True)
    s.env["GPUPOOL_DB_PASSWORD"] = PASSWORD
    servers.started.append(s)
    s.start()
    s.cli("project", "create", "vision", "--deserved-gpus", "1")
    assert [p["name"] for p in s.json("project", "list")] == ["vision"]
    redacted = guarded_db.replace(f"//{role}@", f"//{role}:***@")
    assert f"store {redacted}\n" in s.log()
    assert PASSWORD not in s.log() and PASSWORD.encode() not in _cmdline(s)
    s.kill()
    # The same store through a password file only its owner can read.
    path = tmp_path / "db-password"
    path.write_text(PASSWORD + "\n")
    path.chmod(0o600)
    del s.env["GPUPOOL_DB_PASSWORD"]
    s.args = ("--single-user", "--db-password-file", str(path))
    s.start()
    assert [p["name"] for p in s.json("project", "list")] == ["vision"]
    assert PASSWORD not in s.log()


def test_a_wrong_password_is_a_clear_error_that_does_not_repeat_it(tmp_path: Path, guarded_db: str) -> None:
    role = guarded_db.rsplit("/", 1)[1]
    wrong = "not-" + secrets.token_hex(8)
    err = refused(tmp_path, "--db", guarded_db, env={"GPUPOOL_DB_PASSWORD": wrong})
    redacted = guarded_db.replace(f"//{role}@", f"//{role}:***@")
    assert err.startswith(f"error: cannot use the store {redacted}: connection failed: ")
    assert err.endswith(f'password authentication failed for user "{role}"\n') and wrong not in err
