"""Task templates of the map (MAP): ids 501-599. The map has no accounts."""

from __future__ import annotations

import random

from runtime.base.messages import OracleStep
from sites.builtin import words
from sites.builtin.data import World
from sites.builtin.maps import MODES, format_duration, nearby, route, search_places
from sites.builtin.records import Place
from sites.builtin.template_kit import (
    Built,
    Template,
    button,
    exit_with,
    link,
    search,
    select,
    string_match,
    type_into,
    url_match,
)
from sites.builtin.tenants import Tenant

__all__ = ["TEMPLATES"]

SITE = "map"


def _place(world: World, base: Tenant, name: str) -> Place:
    found = [p for p in base.all(world.places) if p.name == name]
    if not found:
        raise ValueError(f"no place {name!r}")
    return found[0]


def _places(world: World, base: Tenant) -> list[dict[str, str]]:
    return [{"place": p.name} for p in base.all(world.places)]


def _find(name: str) -> OracleStep:
    return search("q", name, f"Search the map for {name}.")


def _coordinates(world: World, base: Tenant, p: dict[str, str]) -> Built:
    place = _place(world, base, p["place"])
    lat, lon = f"{place.lat:.4f}", f"{place.lon:.4f}"
    return Built(
        intent=f"What are the coordinates of {place.name}?",
        start="/",
        eval=string_match(must_include=[lat, lon]),
        plan=[
            _find(place.name),
            link(place.name, f"Open the page of {place.name}."),
            exit_with(f"{lat}, {lon}", f"The coordinates are {lat}, {lon}."),
        ],
    )


def _category(world: World, base: Tenant, p: dict[str, str]) -> Built:
    place = _place(world, base, p["place"])
    return Built(
        intent=f"What kind of place is {place.name}?",
        start="/",
        eval=string_match(exact=place.category),
        plan=[
            _find(place.name),
            exit_with(place.category, f"The result says {place.name} is a {place.category}."),
        ],
    )


def _address(world: World, base: Tenant, p: dict[str, str]) -> Built:
    place = _place(world, base, p["place"])
    return Built(
        intent=f"What is the street address of {place.name}?",
        start="/",
        eval=string_match(must_include=[place.street]),
        plan=[
            _find(place.name),
            exit_with(place.street, f"The result gives the address {place.street}."),
        ],
    )


def _open_place(world: World, base: Tenant, p: dict[str, str]) -> Built:
    place = _place(world, base, p["place"])
    return Built(
        intent=f"Show {place.name} on the map.",
        start="/",
        eval=url_match(SITE, f"/place/{place.id}"),
        plan=[
            _find(place.name),
            link(place.name, f"Open the page of {place.name}."),
            exit_with("", "The place is shown."),
        ],
    )


def _unique_nearest(world: World, base: Tenant) -> list[dict[str, str]]:
    found = []
    for place in base.all(world.places):
        close = nearby(base, world, place)
        if len(close) > 1 and close[0][1] < close[1][1]:
            found.append({"place": place.name})
    return found


def _nearest(world: World, base: Tenant, p: dict[str, str]) -> Built:
    place = _place(world, base, p["place"])
    closest = nearby(base, world, place)[0][0]
    return Built(
        intent=f"Which place is closest to {place.name}?",
        start="/",
        eval=string_match(exact=closest.name),
        plan=[
            _find(place.name),
            link(place.name, f"Open the page of {place.name}."),
            exit_with(closest.name, f"The first nearby place is {closest.name}."),
        ],
    )


def _route_candidates(world: World, base: Tenant, salt: str) -> list[dict[str, str]]:
    rng = random.Random(f"{world.seed}:{salt}")
    places = [p.name for p in base.all(world.places)]
    found = []
    for start in places:
        for end in rng.sample([p for p in places if p != start], 3):
            found.append({"from": start, "to": end, "mode": rng.choice(tuple(MODES))})
    return found


def _route_steps(start: str, end: str, mode: str) -> list[OracleStep]:
    return [
        link("Directions", "Open the directions form."),
        type_into("from", start, f"Enter the start {start}."),
        type_into("to", end, f"Enter the destination {end}."),
        select("mode", mode, f"Travel by {mode}."),
        button("Go", "Compute the route."),
    ]


def _distance(world: World, base: Tenant, p: dict[str, str]) -> Built:
    a, b = _place(world, base, p["from"]), _place(world, base, p["to"])
    km = f"{route(a, b, p['mode'])[0]:.1f}"
    return Built(
        intent=f"How far is it from {a.name} to {b.name} by {p['mode']}?",
        start="/",
        eval=string_match(must_include=[km]),
        plan=[
            *_route_steps(a.name, b.name, p["mode"]),
            exit_with(f"{km} km", f"The route is {km} km long."),
        ],
    )


def _duration(world: World, base: Tenant, p: dict[str, str]) -> Built:
    a, b = _place(world, base, p["from"]), _place(world, base, p["to"])
    time = format_duration(route(a, b, p["mode"])[1])
    return Built(
        intent=f"How long does it take to go from {a.name} to {b.name} by {p['mode']}?",
        start="/",
        eval=string_match(must_include=[time]),
        plan=[
            *_route_steps(a.name, b.name, p["mode"]),
            exit_with(time, f"The route takes {time}."),
        ],
    )


def _search_terms(world: World, base: Tenant) -> list[dict[str, str]]:
    terms = [kind for kind, _ in words.PLACE_KINDS]
    terms += sorted({p.name.split(" ", 1)[0] for p in base.all(world.places)})
    return [{"term": t} for t in terms if search_places(base, world, t)]


def _search_count(world: World, base: Tenant, p: dict[str, str]) -> Built:
    count = str(len(search_places(base, world, p["term"])))
    return Built(
        intent=f"How many results does a map search for '{p['term']}' give?",
        start="/",
        eval=string_match(exact=count),
        plan=[
            search("q", p["term"], f"Search the map for {p['term']}."),
            exit_with(count, f"The search gives {count} results."),
        ],
    )


def _walk_from_here(world: World, base: Tenant, p: dict[str, str]) -> Built:
    a, b = _place(world, base, p["from"]), _place(world, base, p["to"])
    km = f"{route(a, b, 'Foot')[0]:.1f}"
    return Built(
        intent=f"Starting from this place, how far is the walk to {b.name}?",
        start=f"/place/{a.id}",
        eval=string_match(must_include=[km]),
        plan=[
            link("Directions from here", "Open directions starting from this place."),
            type_into("to", b.name, f"Enter the destination {b.name}."),
            select("mode", "Foot", "Walk."),
            button("Go", "Compute the route."),
            exit_with(f"{km} km", f"The walk is {km} km."),
        ],
    )


TEMPLATES = [
    Template(
        501, SITE, "coordinates", "What are the coordinates of {place}?", _places, _coordinates
    ),
    Template(
        502, SITE, "place_kind", "What kind of place is {place}?", _places, _category, train_cap=40
    ),
    Template(
        503,
        SITE,
        "address",
        "What is the street address of {place}?",
        _places,
        _address,
        train_cap=40,
    ),
    Template(
        504,
        SITE,
        "distance",
        "How far is it from {from} to {to} by {mode}?",
        lambda w, b: _route_candidates(w, b, "map-distance"),
        _distance,
    ),
    Template(
        505,
        SITE,
        "duration",
        "How long does it take to go from {from} to {to} by {mode}?",
        lambda w, b: _route_candidates(w, b, "map-duration"),
        _duration,
    ),
    Template(506, SITE, "nearest", "Which place is closest to {place}?", _unique_nearest, _nearest),
    Template(507, SITE, "open_place", "Show {place} on the map.", _places, _open_place),
    Template(
        508,
        SITE,
        "search_count",
        "How many results does a map search for '{term}' give?",
        _search_terms,
        _search_count,
        ood=True,
        train_cap=12,
    ),
    Template(
        509,
        SITE,
        "walk_from_here",
        "Starting from this place, how far is the walk to {to}?",
        lambda w, b: [
            {"from": c["from"], "to": c["to"]} for c in _route_candidates(w, b, "map-walk")
        ],
        _walk_from_here,
        ood=True,
        train_cap=12,
    ),
]
