"""anomalies.subject: the bus subject a rejected message arrived on (None for log files)

Revision ID: 0003
Revises: 0002
"""
from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('anomalies') as batch:
        batch.add_column(sa.Column('subject', sa.String(length=512), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('anomalies') as batch:
        batch.drop_column('subject')
