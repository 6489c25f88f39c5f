"""API tokens: hashed secrets with scopes

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26 14:40:00.000000
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'api_tokens',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('name', sa.String(length=200), nullable=False),
        sa.Column('secret_sha256', sa.String(length=64), nullable=False),
        sa.Column('scopes', sa.String(length=200), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.Column('revoked_at', sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens')),
        sa.UniqueConstraint('secret_sha256', name=op.f('uq_api_tokens_secret_sha256')),
    )


def downgrade() -> None:
    op.drop_table('api_tokens')
