"""runs that span machines: workers waiting to join a gang, and the nodes of a gang's run

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26 14:40:00.000000
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('gang_members',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('worker', sa.String(length=200), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('devices', sa.Integer(), nullable=False),
    sa.Column('port', sa.Integer(), nullable=False),
    sa.Column('expires_at', sa.DateTime(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=True),
    sa.Column('token', sa.String(length=64), nullable=True),
    sa.Column('node_rank', sa.Integer(), nullable=True),
    sa.Column('report', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_gang_members_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_gang_members')),
    sa.UniqueConstraint('worker', name=op.f('uq_gang_members_worker'))
    )
    with op.batch_alter_table('gang_members', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_gang_members_run_id'), ['run_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('gang_members', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_gang_members_run_id'))
    op.drop_table('gang_members')
