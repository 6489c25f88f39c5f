"""The migrations: applied on start, in step with the ORM models, reversible, on both databases."""

from __future__ import annotations

from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from service.db import Database, alembic_config


def test_migrations_match_the_models_and_reverse(databases, backend):
    db = Database(databases.fresh(backend))
    try:
        db.migrate()
        cfg = alembic_config(db.engine)
        # one line of revisions, numbered in order: two branches that each add one off the same
        # parent would leave two heads, and `upgrade head` refuses to start
        revisions = list(ScriptDirectory.from_config(cfg).walk_revisions())
        assert [r.revision for r in reversed(revisions)] == [f"{i:04d}" for i in range(1, len(revisions) + 1)]
        with db.engine.connect() as conn:
            cfg.attributes["connection"] = conn
            command.check(cfg)  # raises when autogenerate would write a new migration
        tables = set(inspect(db.engine).get_table_names())
        assert {"searches", "jobs", "strategies", "runs", "events", "profiles", "resizes"} <= tables
        with db.engine.execution_options(write=True).connect() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "base")
            conn.commit()
        assert set(inspect(db.engine).get_table_names()) <= {"alembic_version"}
        db.migrate()  # and up again, as on the next start
        assert {"searches", "jobs"} <= set(inspect(db.engine).get_table_names())
    finally:
        db.dispose()
