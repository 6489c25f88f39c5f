"""Alembic migrations of the service's database (applied on start by `service.db.migrate`)."""
