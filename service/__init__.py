"""paretoplan's service: the REST API, the database and the job queue (docs/api.md).

Layers: `schemas` (pydantic, the API's edge) -> `crud/<resource>` (operations on the ORM of
`models`) -> `api/routes/<resource>` (one router each); `queue` claims and leases tasks (the one
dialect difference lives there); `db` makes engines and sessions and applies the Alembic
migrations of `migrations/`; `app.create_app(settings)` wires it; `server.serve` runs it under
uvicorn with local workers. `client` and `agent` are the worker's side (`paretoplan worker`):
they talk to the API over REST only.
"""
