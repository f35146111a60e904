"""events: an index on (type, pos), for the reads that select events by type

The console's engines and switches views, `prorsa export --with-engines` and the engine
registrations a replay needs select a few event types out of the whole log (engine
events are a few per thousand of a run's events). Without this index each such read
scans the `events` table.

Revision ID: 0004
Revises: 0003
"""
from alembic import op


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('events') as batch:
        batch.create_index('ix_events_type_pos', ['type', 'pos'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('events') as batch:
        batch.drop_index('ix_events_type_pos')
