"""One frozen settings object built from flags and the environment."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    database_url: str | None = None  # None: resolve from the environment or the embedded server
    handler_modules: tuple[str, ...] = ()
    tenants_sql: str | None = None

    @classmethod
    def build(
        cls,
        database_url: str | None = None,
        handlers: str | None = None,
        tenants_sql: str | None = None,
    ) -> Settings:
        modules = tuple(m.strip() for m in (handlers or "").split(",") if m.strip())
        return cls(database_url or None, modules, tenants_sql or None)
