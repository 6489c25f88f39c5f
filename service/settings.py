"""Settings of the service, from the environment (and a `.env` file) via pydantic-settings.

Every field reads `PARETOPLAN_<FIELD>`; the database URL also reads plain `DATABASE_URL`, the
name docker-compose and most hosts use.
"""

from __future__ import annotations

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 1024 * 1024


def normalise_database_url(url: str) -> str:
    """`postgres://` and `postgresql://` mean psycopg 3 here (the only PostgreSQL driver installed)."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PARETOPLAN_", env_file=".env", extra="ignore", env_ignore_empty=True)

    database_url: str = Field(
        default="sqlite:///./paretoplan.db",
        validation_alias=AliasChoices("PARETOPLAN_DATABASE_URL", "DATABASE_URL", "database_url"),
        description="SQLAlchemy URL: sqlite:///path.db (default ./paretoplan.db) or postgresql+psycopg://user@host/db",
    )
    host: str = Field(default="127.0.0.1", description="address `paretoplan serve` listens on")
    port: int = Field(default=8000, ge=0, le=65535, description="port `paretoplan serve` listens on")
    lease_seconds: float = Field(default=30.0, gt=0, le=86400,
                                 description="how long a claimed task stays a worker's without a heartbeat")
    max_attempts: int = Field(default=3, ge=1, le=100,
                              description="claims of one task (each lease that expires costs one) before it fails")
    max_body_bytes: int = Field(default=32 * MiB, ge=1024, description="largest request body accepted (413 above)")
    max_inflated_bytes: int = Field(default=64 * MiB, ge=1024,
                                    description="largest gzip request body once decompressed (workers gzip reports)")
    sse_poll_seconds: float = Field(default=0.25, gt=0, le=10, description="how often an event stream looks for news")
    sse_max_seconds: float = Field(default=300.0, gt=0,
                                   description="an event stream closes after this long; clients resume with Last-Event-ID")
    resize_wait_max_seconds: float = Field(default=120.0, ge=0, description="longest ?wait= a resize may ask for")
    auth: bool = Field(default=True, description="require a token on every API call (off only with a loopback host)")
    admin_token: str | None = Field(default=None, min_length=24, max_length=200,
                                    description="a token with the read, submit and admin scopes, besides the stored "
                                                "ones; `paretoplan serve` makes one per start when unset (its login link)")
    worker_token: str | None = Field(default=None, min_length=24, max_length=200,
                                     description="the token workers send, besides stored worker tokens; `paretoplan "
                                                 "serve` makes one per start for its local workers when unset")
    allowed_hosts: list[str] | None = Field(default=None, description="Host names the service answers to ('*': any); "
                                            "default: the loopback names on a loopback host, else any")

    max_claim_seconds: float = Field(default=7 * 86400.0, gt=0, description="a claim older than this is not renewed "
                                     "(a worker stuck in a task lets go of it)")
    header_timeout_seconds: float = Field(default=10.0, gt=0, le=300,
                                          description="a request's headers must arrive within this long (slow clients)")
    max_connections: int = Field(default=1000, ge=10, description="connections and requests at once (503 beyond)")
    max_sse_clients: int = Field(default=200, ge=1, description="event streams open at once (503 beyond)")

    @model_validator(mode="after")
    def _no_auth_on_loopback_only(self) -> Settings:
        from service.api.guard import is_loopback

        if not self.auth and not is_loopback(self.host):
            raise ValueError(f"auth can be off only on a loopback host (127.0.0.1, ::1, localhost), not {self.host!r}: "
                             "anyone who reaches the port could submit, launch and read everything")
        return self

    @property
    def hosts(self) -> list[str]:
        from service.api.guard import default_allowed_hosts

        return self.allowed_hosts if self.allowed_hosts is not None else default_allowed_hosts(self.host)

    @field_validator("database_url")
    @classmethod
    def _normalise(cls, v: str) -> str:
        return normalise_database_url(v.strip())

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")
