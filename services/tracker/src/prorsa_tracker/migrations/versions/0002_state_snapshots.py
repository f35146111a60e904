"""state snapshots: the tracker's in-memory state, committed with the batch it follows

Revision ID: 0002
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('snapshots',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('format', sa.Integer(), nullable=False),
    sa.Column('event_pos', sa.BigInteger(), nullable=False),
    sa.Column('state', sa.LargeBinary(), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )


def downgrade() -> None:
    op.drop_table('snapshots')
