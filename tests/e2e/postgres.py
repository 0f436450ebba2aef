"""A throwaway PostgreSQL server from Debian's packages, in a temp dir, for the tests."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
from pathlib import Path

import psycopg


def _bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        raise RuntimeError(
            f"PostgreSQL's {name} is not installed (Debian package postgresql); scripts/test installs it"
        )
    return found


class Postgres:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self._n = 0
        # PostgreSQL refuses to run as root; as root, run it as the postgres user the package created.
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *cmd: str) -> None:
        subprocess.run([*self._as, *cmd], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        if self._as:
            shutil.chown(self.root, "postgres")
            os.chmod(self.root, 0o700)
        self._run(_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300"
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-o", opts, "-l", str(self.root / "log"), "-w", "start")

    def stop(self) -> None:
        subprocess.run(
            [*self._as, _bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"], capture_output=True
        )

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        self._n += 1
        name = f"gpupool_{self._n}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)
