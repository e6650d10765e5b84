"""The map (MAP, like OpenStreetMap): place search, place pages, directions by mode.

Routes are computed, not looked up: the great-circle distance between two places times a
detour factor of the mode, and a time at the mode's average speed.
"""

from __future__ import annotations

import math

from starlette.responses import Response

from sites.builtin.data import World
from sites.builtin.records import Place
from sites.builtin.tenants import Tenant, TenantStore
from sites.builtin.web import Counters, Req, Site

__all__ = [
    "MODES",
    "build_map",
    "format_duration",
    "nearby",
    "place_by_name",
    "route",
    "search_places",
]

# Mode (the option text of the directions form) -> (detour factor, km/h).
MODES = {"Car": (1.35, 30.0), "Bicycle": (1.25, 15.0), "Foot": (1.2, 5.0)}
NEARBY = 5


def _km(a: Place, b: Place) -> float:
    lat1, lon1, lat2, lon2 = map(math.radians, (a.lat, a.lon, b.lat, b.lon))
    h = (
        math.sin((lat2 - lat1) / 2) ** 2
        + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
    )
    return 2 * 6371.0 * math.asin(math.sqrt(h))


def route(a: Place, b: Place, mode: str) -> tuple[float, int]:
    """(distance in km rounded to 0.1, minutes rounded, at least 1) from a to b by mode."""
    factor, speed = MODES[mode]
    km = round(_km(a, b) * factor, 1)
    return km, max(1, round(km / speed * 60))


def format_duration(minutes: int) -> str:
    """`75` -> `"1 h 15 min"`, `9` -> `"9 min"`."""
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest} min" if hours else f"{rest} min"


def search_places(tenant: Tenant, world: World, query: str) -> list[Place]:
    """Places whose name or category contains every word of `query`, by name."""
    terms = query.lower().split()
    if not terms:
        return []
    found = [
        p
        for p in tenant.all(world.places)
        if all(term in f"{p.name} {p.category}".lower() for term in terms)
    ]
    return sorted(found, key=lambda p: p.name)


def place_by_name(tenant: Tenant, world: World, name: str) -> Place | None:
    wanted = " ".join(name.lower().split())
    found = [p for p in tenant.all(world.places) if p.name.lower() == wanted]
    return found[0] if found else None


def nearby(tenant: Tenant, world: World, place: Place) -> list[tuple[Place, float]]:
    """The nearest other places with their straight-line distance in km (0.01 km)."""
    others = [(p, round(_km(place, p), 2)) for p in tenant.all(world.places) if p.id != place.id]
    return sorted(others, key=lambda pd: (pd[1], pd[0].name))[:NEARBY]


def build_map(world: World, tenants: TenantStore, counters: Counters) -> Site:
    """The map's app."""
    site = Site(
        name="map",
        title="OpenStreetMap",
        nav=[("Directions", "/directions")],
        world=world,
        tenants=tenants,
        counters=counters,
    )

    async def home(req: Req) -> Response:
        return req.render("map/home.html")

    async def search(req: Req) -> Response:
        query = req.arg("q")
        return req.render(
            "map/search.html", query=query, places=search_places(req.tenant, world, query)
        )

    async def place(req: Req) -> Response:
        found = req.tenant.get(world.places, req.path_int("place_id"))
        if found is None:
            return req.not_found("No such place.")
        return req.render("map/place.html", place=found, nearby=nearby(req.tenant, world, found))

    async def directions(req: Req) -> Response:
        start, end, mode = req.arg("from"), req.arg("to"), req.arg("mode", "Car")
        error, result = "", None
        if start or end:
            a = place_by_name(req.tenant, world, start)
            b = place_by_name(req.tenant, world, end)
            if mode not in MODES:
                error = f"Unknown mode of transport {mode!r}."
            elif a is None or b is None:
                missing = start if a is None else end
                error = f"No place named {missing!r} was found. Use a place's full name."
            else:
                km, minutes = route(a, b, mode)
                result = {"from": a, "to": b, "km": km, "time": format_duration(minutes)}
        return req.render(
            "map/directions.html",
            start=start,
            end=end,
            mode=mode,
            modes=MODES,
            error=error,
            result=result,
        )

    site.add("/", home)
    site.add("/search", search)
    site.add("/place/{place_id:int}", place)
    site.add("/directions", directions)
    return site
