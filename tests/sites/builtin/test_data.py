"""The seeded data and the copy-on-write tenant store."""

from __future__ import annotations

import gc
import weakref
from collections import Counter

import msgspec

from sites.builtin.data import World, build_world
from sites.builtin.records import Forum, Post
from sites.builtin.tenants import Table, Tenant, TenantStore


def _dump(world: World) -> bytes:
    tables = {
        name: list(t.rows.values()) for name, t in vars(world).items() if isinstance(t, Table)
    }
    return msgspec.json.encode(tables)


def test_same_seed_same_data_other_seed_other_data() -> None:
    assert _dump(World(0)) == _dump(World(0))
    assert _dump(World(0)) != _dump(World(1))


def test_sizes_meet_the_minimums() -> None:
    sizes = build_world(0).sizes()
    assert sizes["products"] >= 200
    assert sizes["orders"] >= 100
    assert sizes["forums"] >= 20
    assert sizes["posts"] >= 300
    assert sizes["projects"] >= 15
    assert sizes["places"] >= 60
    assert sizes["issues"] >= 200
    assert sizes["comments"] >= 500


def test_names_that_tasks_use_are_unique() -> None:
    world = build_world(0)
    for names in (
        [p.name for p in world.products.rows.values()],
        [p.sku for p in world.products.rows.values()],
        [c.name for c in world.customers.rows.values()],
        [f"{p.forum_id}/{p.title}" for p in world.posts.rows.values()],
        [p.path for p in world.projects.rows.values()],
        [f"{i.project_id}/{i.title}" for i in world.issues.rows.values()],
        [p.name for p in world.places.rows.values()],
    ):
        repeated = [name for name, n in Counter(names).items() if n > 1]
        assert not repeated


def _posts() -> Table[Post]:
    rows = [
        Post(id=i, forum_id=1 + i % 2, author="a", title=f"t{i}", body="", score=i, created="")
        for i in range(1, 6)
    ]
    return Table("posts", rows)


def test_tenant_writes_stay_in_its_overlay() -> None:
    posts = _posts()
    one, two = Tenant("one"), Tenant("two")
    assert one.all(posts)[0] is posts.rows[1]  # reads share the seeded rows: nothing copied
    edited = msgspec.structs.replace(posts.rows[1], title="edited", forum_id=1)  # was 2
    one.put(posts, edited)
    one.delete(posts, 2)
    new = one.insert(
        posts,
        lambda i: Post(id=i, forum_id=1, author="b", title="new", body="", score=0, created=""),
    )
    assert new.id == 6
    assert one.get(posts, 1) == edited
    assert one.get(posts, 2) is None
    assert [p.id for p in one.all(posts)] == [1, 3, 4, 5, 6]
    assert [p.id for p in one.where(posts, "forum_id", 1)] == [1, 4, 6]
    assert [p.id for p in one.where(posts, "forum_id", 2)] == [3, 5]
    assert one.written_rows() == 3
    # The other tenant and the table itself are untouched; ids are per tenant.
    assert [p.title for p in two.all(posts)] == ["t1", "t2", "t3", "t4", "t5"]
    assert [p.id for p in two.where(posts, "forum_id", 2)] == [1, 3, 5]
    assert two.insert(posts, lambda i: msgspec.structs.replace(posts.rows[1], id=i)).id == 6
    assert posts.rows[1].title == "t1" and len(posts) == 5


def test_store_drops_frees_and_evicts_least_recently_used() -> None:
    store = TenantStore(max_tenants=2)
    a, b = store.create(), store.create()
    assert a.id != b.id and len(a.id) == 16
    store.lookup(a.id)  # a is now the most recently used
    c = store.create()
    assert b.id not in store and a.id in store and c.id in store
    assert store.evicted == 1
    gone = weakref.ref(a)
    a.put(Table("forums", []), Forum(id=1, name="x", title="X", description=""))
    assert store.written_rows() == 1
    assert store.drop(a.id) is True
    assert store.drop(a.id) is False
    del a
    gc.collect()
    assert gone() is None  # nothing else holds a dropped tenant's state
    assert store.lookup("unknown") is None
    assert (store.created, store.dropped, len(store)) == (3, 1, 1)
