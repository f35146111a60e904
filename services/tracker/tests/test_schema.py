"""The migrations build the schema the models declare, and the reads that select events by
type use their index, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import select

from prorsa_tracker import console_queries as cq
from prorsa_tracker.db import make_engine, migrate
from prorsa_tracker.models import Base, EventRow


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/schema.db"
    return request.getfixturevalue("pg_url")


def test_the_migrations_build_the_models_schema(db_url) -> None:
    eng = make_engine(db_url)
    try:
        migrate(eng)
        with eng.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == []
    finally:
        eng.dispose()


def _plan(conn, query, postgres: bool) -> str:
    sql = str(query.compile(conn.engine, compile_kwargs={"literal_binds": True}))
    if postgres:
        conn.exec_driver_sql("SET enable_seqscan = off")  # an empty table: ask whether the index serves
        return "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + sql))
    return "\n".join(str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql))


def test_reads_by_type_use_the_type_index(db_url) -> None:
    eng = make_engine(db_url)
    try:
        migrate(eng)
        postgres = eng.dialect.name == "postgresql"
        with eng.connect() as conn:
            # The console's engines view: a few types out of every run's events.
            by_types = select(EventRow.raw).where(EventRow.type.in_(cq.ENGINE_ROLE_TYPES)).order_by(EventRow.pos)
            # A replay's engine registrations before a run (tools.py), newest first.
            registered = (select(EventRow.pos, EventRow.raw)
                          .where(EventRow.type == "engine.registered", EventRow.pos < 1000)
                          .order_by(EventRow.pos.desc()))
            for q in (by_types, registered):
                assert "ix_events_type_pos" in _plan(conn, q, postgres)
    finally:
        eng.dispose()
