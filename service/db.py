"""Engine, sessions and migrations.

SQLite: WAL journal and a busy timeout, and every write transaction opened with BEGIN IMMEDIATE
(it takes the write lock up front, so two writers queue on the busy timeout instead of one
failing when it upgrades a read lock). Reads use a plain deferred BEGIN. PostgreSQL needs
nothing special. `write_session()` is what every mutating operation uses.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BUSY_MS = 10_000
STATEMENT_TIMEOUT_S = 30.0  # a statement running longer is cancelled (503): a hung database hangs no endpoint
CONNECT_TIMEOUT_S = 5
POOL_TIMEOUT_S = 10.0  # waiting for a pooled connection longer is a 503, not a hang
_MIGRATIONS = Path(__file__).parent / "migrations"


def make_engine(url: str, statement_timeout: float = STATEMENT_TIMEOUT_S) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_MS / 1000},
                               json_serializer=_json, pool_timeout=POOL_TIMEOUT_S)

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn, record) -> None:
            dbapi_conn.isolation_level = None  # we emit BEGIN ourselves, below
            # SQLite has no statement timeout: its progress handler, called every 10k VM steps,
            # interrupts a statement past its deadline (sqlite3.OperationalError: interrupted)
            deadline = record.info["deadline"] = [0.0]
            dbapi_conn.set_progress_handler(lambda: int(0.0 < deadline[0] < time.monotonic()), 10_000)
            cur = dbapi_conn.cursor()
            if ":memory:" not in url and url not in ("sqlite://", "sqlite:///"):
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("write") else "BEGIN")

        @event.listens_for(engine, "before_cursor_execute")
        def _arm(conn, _cursor, _statement, _params, _context, _many) -> None:
            box = conn.info.get("deadline")
            if box is not None:
                box[0] = time.monotonic() + statement_timeout

        @event.listens_for(engine, "after_cursor_execute")
        def _disarm(conn, _cursor, _statement, _params, _context, _many) -> None:
            box = conn.info.get("deadline")
            if box is not None:
                box[0] = 0.0

        return engine
    options = f"-c statement_timeout={int(statement_timeout * 1000)} -c lock_timeout={int(statement_timeout * 1000)}"
    return create_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True, json_serializer=_json,
                         pool_timeout=POOL_TIMEOUT_S,
                         connect_args={"connect_timeout": CONNECT_TIMEOUT_S, "options": options})


def _json(obj) -> str:
    """Compact, and strict: NaN or Infinity is not JSON and PostgreSQL would refuse it."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


class Database:
    """An engine with a read session factory and a write session factory."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._read = sessionmaker(self.engine, expire_on_commit=False)
        self._write = sessionmaker(self.engine.execution_options(write=True), expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A read session; closing it ends its transaction (nothing it did is kept) and leaves the
        objects it loaded readable."""
        with self._read() as s:
            yield s

    @contextmanager
    def write_session(self) -> Iterator[Session]:
        """A write transaction: committed on success, rolled back on any exception."""
        with self._write() as s, s.begin():
            yield s

    def migrate(self) -> None:
        migrate(self.engine)

    def dispose(self) -> None:
        self.engine.dispose()


def alembic_config(engine: Engine | None = None):
    """Alembic's Config built in code (no alembic.ini): the script folder inside this package."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    if engine is not None:
        cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    return cfg


def migrate(engine: Engine, revision: str = "head") -> None:
    """Bring the database's schema to `revision` (what `create_app` does on start)."""
    from alembic import command

    cfg = alembic_config(engine)
    with engine.execution_options(write=True).connect() as conn:
        if engine.dialect.name == "postgresql":
            # several processes may start at once against one database: one migrates, the others wait
            conn.exec_driver_sql("SELECT pg_advisory_lock(72150515)")
        try:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            conn.commit()
        finally:
            if engine.dialect.name == "postgresql":
                conn.exec_driver_sql("SELECT pg_advisory_unlock(72150515)")
                conn.commit()
