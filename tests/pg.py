"""A real PostgreSQL server for the tests: Debian's binaries (/usr/lib/postgresql/*/bin,
the ``postgresql`` package that setup installs), a data directory under /tmp made by
``initdb``, started by ``pg_ctl`` on a unix socket in that directory only (no TCP port to
collide with), as the ``postgres`` user when the tests run as root (the server refuses
root). One per test session (``postgres_server`` in conftest.py); each test gets a database
of its own (``create_database``). Durability is off (fsync): a test server needs speed."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

PORT = 5432  # names the socket file only: the server listens on no TCP address


class PostgresUnavailable(RuntimeError):
    """The server's binaries are missing, or it did not start."""


def binaries() -> Path:
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/postgres"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if not found:
        raise PostgresUnavailable(
            "no PostgreSQL server under /usr/lib/postgresql/*/bin "
            "(make setup installs Debian's postgresql)"
        )
    return Path(found[-1]).parent


class PostgresServer:
    def __init__(self, root: Path, user: str | None) -> None:
        self.root = root
        self.data = root / "data"
        self.log = root / "server.log"
        self.user = user  # the OS user the server runs as (None: this process's user)

    @classmethod
    def start(cls) -> PostgresServer:
        bindir = binaries()
        user = None
        root = Path(tempfile.mkdtemp(prefix="llmr-pg-", dir="/tmp"))
        if os.geteuid() == 0:
            try:
                entry = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable(
                    "running as root and there is no 'postgres' user"
                ) from None
            user = "postgres"
            os.chown(root, entry.pw_uid, entry.pw_gid)
        server = cls(root, user)
        server._run(
            bindir / "initdb",
            "-D",
            server.data,
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        )
        settings = (
            f"-k {root} -c listen_addresses='' -p {PORT} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=50"
        )
        try:
            server._run(
                bindir / "pg_ctl",
                "-D",
                server.data,
                "-l",
                server.log,
                "-o",
                settings,
                "-w",
                "-t",
                "30",
                "start",
            )
        except PostgresUnavailable as exc:
            log = server.log.read_text()[-2000:] if server.log.exists() else ""
            server.remove()
            raise PostgresUnavailable(f"{exc}\n{log}") from None
        server.bindir = bindir
        return server

    def _run(self, *argv: object) -> None:
        proc = subprocess.run(
            [str(a) for a in argv],
            user=self.user,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if proc.returncode != 0:
            raise PostgresUnavailable(
                f"{Path(str(argv[0])).name} failed ({proc.returncode}): "
                f"{(proc.stderr or proc.stdout)[-2000:]}"
            )

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@/{database}?host={self.root}&port={PORT}"

    def create_database(self) -> str:
        """A new empty database; its SQLAlchemy URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(
            host=str(self.root), port=PORT, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run(self.bindir / "pg_ctl", "-D", self.data, "-m", "immediate", "stop")
        finally:
            self.remove()

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
