"""Copy-on-write tenant state over the shared, immutable seeded data.

    Table[R]      the seeded rows of one table (shared by every tenant, never changed)
    Tenant        one episode's view: an overlay {table: {id: row | None}} over the tables,
                  its login sessions, its id counters; creating one copies nothing
    TenantStore   the live tenants by id, bounded (least recently used evicted first)

A read looks in the tenant's overlay first, then in the table; a write goes to the
overlay only (None marks a deleted row). A tenant made with no overlay is the seeded
data itself: the task suite computes its reference answers through the same queries the
sites use, on such a tenant.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from sites.builtin.records import Record

__all__ = ["Table", "Tenant", "TenantStore"]

R = TypeVar("R", bound=Record)


class Table(Generic[R]):
    """The seeded rows of one table, by id, with lazily built equality indexes."""

    def __init__(self, name: str, rows: Iterable[R]) -> None:
        self.name = name
        self.rows: dict[int, R] = {row.id: row for row in sorted(rows, key=lambda r: r.id)}
        self.next_id = max(self.rows, default=0) + 1
        self._indexes: dict[str, dict[Any, list[int]]] = {}

    def index(self, field: str) -> dict[Any, list[int]]:
        """{value: [ids in id order]} for one field (built on first use)."""
        found = self._indexes.get(field)
        if found is None:
            found = {}
            for row_id, row in self.rows.items():
                found.setdefault(getattr(row, field), []).append(row_id)
            self._indexes[field] = found
        return found

    def __len__(self) -> int:
        return len(self.rows)


class Tenant:
    """One tenant's state: its writes over the seeded tables, and its login sessions."""

    def __init__(self, tenant_id: str) -> None:
        self.id = tenant_id
        # Site name ("shopping", "reddit", ...) -> the logged-in account's user name.
        self.sessions: dict[str, str] = {}
        # Site name -> a message shown once on the next page of that site.
        self.flashes: dict[str, str] = {}
        self._overlay: dict[str, dict[int, Record | None]] = {}
        self._next_ids: dict[str, int] = {}

    # ------------------------------------------------------------------ reads

    def get(self, table: Table[R], row_id: int) -> R | None:
        """The row with this id, or None (absent or deleted)."""
        overlay = self._overlay.get(table.name)
        if overlay is not None and row_id in overlay:
            return overlay[row_id]  # type: ignore[return-value]
        return table.rows.get(row_id)

    def all(self, table: Table[R]) -> list[R]:
        """Every row, in id order."""
        overlay = self._overlay.get(table.name)
        if not overlay:
            return list(table.rows.values())
        merged: dict[int, R] = dict(table.rows)
        for row_id, row in overlay.items():
            if row is None:
                merged.pop(row_id, None)
            else:
                merged[row_id] = row  # type: ignore[assignment]
        return [merged[row_id] for row_id in sorted(merged)]

    def where(self, table: Table[R], field: str, value: Any) -> list[R]:
        """The rows whose `field` equals `value`, in id order (uses the table's index)."""
        base_ids = table.index(field).get(value, [])
        overlay = self._overlay.get(table.name)
        if not overlay:
            return [table.rows[row_id] for row_id in base_ids]
        found: dict[int, R] = {row_id: table.rows[row_id] for row_id in base_ids}
        for row_id, row in overlay.items():
            if row is not None and getattr(row, field) == value:
                found[row_id] = row  # type: ignore[assignment]
            else:
                found.pop(row_id, None)
        return [found[row_id] for row_id in sorted(found)]

    # ------------------------------------------------------------------ writes

    def put(self, table: Table[R], row: R) -> R:
        """Store a new version of a row (an edit, or a new row with a known id)."""
        self._overlay.setdefault(table.name, {})[row.id] = row
        return row

    def insert(self, table: Table[R], build: Callable[[int], R]) -> R:
        """A new row: `build(new_id)` with the next id of this tenant's table."""
        new_id = self._next_ids.get(table.name, table.next_id)
        self._next_ids[table.name] = new_id + 1
        return self.put(table, build(new_id))

    def delete(self, table: Table[Any], row_id: int) -> None:
        self._overlay.setdefault(table.name, {})[row_id] = None

    def written_rows(self) -> int:
        """How many rows this tenant changed, added or deleted."""
        return sum(len(rows) for rows in self._overlay.values())


class TenantStore:
    """The live tenants. Past `max_tenants`, the least recently used one is evicted."""

    def __init__(self, max_tenants: int) -> None:
        self.max_tenants = max_tenants
        self._tenants: OrderedDict[str, Tenant] = OrderedDict()
        self.created = 0
        self.dropped = 0
        self.evicted = 0

    def create(self) -> Tenant:
        tenant = Tenant(secrets.token_hex(8))
        while len(self._tenants) >= self.max_tenants:
            self._tenants.popitem(last=False)
            self.evicted += 1
        self._tenants[tenant.id] = tenant
        self.created += 1
        return tenant

    def lookup(self, tenant_id: str) -> Tenant | None:
        """The tenant, marked as just used; None if unknown (never created, or dropped)."""
        tenant = self._tenants.get(tenant_id)
        if tenant is not None:
            self._tenants.move_to_end(tenant_id)
        return tenant

    def drop(self, tenant_id: str) -> bool:
        """Forget a tenant (its overlay is freed); False if it was not there."""
        if self._tenants.pop(tenant_id, None) is None:
            return False
        self.dropped += 1
        return True

    def __len__(self) -> int:
        return len(self._tenants)

    def __contains__(self, tenant_id: object) -> bool:
        return tenant_id in self._tenants

    def written_rows(self) -> int:
        return sum(tenant.written_rows() for tenant in self._tenants.values())
