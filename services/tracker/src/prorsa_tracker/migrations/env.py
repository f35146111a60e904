"""Alembic environment: runs on the connection that :func:`prorsa_tracker.db.migrate` passes."""

from alembic import context

from prorsa_tracker.models import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:  # `alembic` CLI use: build an engine from the ini's URL
    from prorsa_tracker.db import make_engine

    with make_engine(config.get_main_option("sqlalchemy.url")).begin() as connection:
        context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
        context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
