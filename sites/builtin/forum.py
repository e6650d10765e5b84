"""The forum (REDDIT, like Postmill): forums, posts, comments, votes, submissions, users."""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.responses import Response

from sites.builtin.data import NOW, World
from sites.builtin.records import Comment, Forum, Post, Subscription, Vote
from sites.builtin.tenants import Tenant, TenantStore
from sites.builtin.web import Counters, Redirect, Req, Site, paginate

__all__ = [
    "FORUM_SORTS",
    "POSTS_PER_PAGE",
    "build_forum",
    "forum_by_name",
    "forum_posts",
    "front_page",
    "user_comments",
    "user_posts",
]

POSTS_PER_PAGE = 10
# Sort key -> link text on forum pages.
FORUM_SORTS = {"hot": "Hot", "new": "New", "top": "Top"}


def _comment_count(tenant: Tenant, world: World, post: Post) -> int:
    return len(tenant.where(world.comments, "post_id", post.id))


def _sort_posts(tenant: Tenant, world: World, posts: list[Post], sort: str) -> list[Post]:
    """Hot: score plus five per comment; New: newest first; Top: highest score. Ties: newest."""
    by_new = sorted(posts, key=lambda p: (p.created, p.id), reverse=True)
    if sort == "new":
        return by_new
    if sort == "top":
        return sorted(by_new, key=lambda p: -p.score)
    return sorted(by_new, key=lambda p: -(p.score + 5 * _comment_count(tenant, world, p)))


def forum_by_name(tenant: Tenant, world: World, name: str) -> Forum | None:
    found = [f for f in tenant.all(world.forums) if f.name == name]
    return found[0] if found else None


def forum_posts(tenant: Tenant, world: World, forum_id: int, sort: str = "hot") -> list[Post]:
    return _sort_posts(tenant, world, tenant.where(world.posts, "forum_id", forum_id), sort)


def front_page(tenant: Tenant, world: World) -> list[Post]:
    return _sort_posts(tenant, world, tenant.all(world.posts), "hot")


def user_posts(tenant: Tenant, world: World, username: str) -> list[Post]:
    return _sort_posts(tenant, world, tenant.where(world.posts, "author", username), "new")


def user_comments(tenant: Tenant, world: World, username: str) -> list[Comment]:
    found = tenant.where(world.comments, "author", username)
    return sorted(found, key=lambda c: (c.created, c.id), reverse=True)


def build_forum(world: World, tenants: TenantStore, counters: Counters) -> Site:
    """The forum's app."""
    site = Site(
        name="reddit",
        title="Postmill",
        nav=[("Forums", "/forums"), ("Submit", "/submit"), ("Subscriptions", "/subscriptions")],
        world=world,
        tenants=tenants,
        counters=counters,
    )

    def listing(req: Req, posts: list[Post]) -> dict[str, Any]:
        forums = {f.id: f for f in req.tenant.all(world.forums)}
        return {
            "page": paginate(posts, req, POSTS_PER_PAGE),
            "forums": forums,
            "comments": {p.id: _comment_count(req.tenant, world, p) for p in posts},
        }

    def find_post(req: Req) -> tuple[Forum, Post] | None:
        forum = forum_by_name(req.tenant, world, req.request.path_params["forum"])
        post = req.tenant.get(world.posts, req.path_int("post_id"))
        if forum is None or post is None or post.forum_id != forum.id:
            return None
        return forum, post

    async def home(req: Req) -> Response:
        return req.render("forum/home.html", **listing(req, front_page(req.tenant, world)))

    async def forums(req: Req) -> Response:
        all_forums = sorted(req.tenant.all(world.forums), key=lambda f: f.name)
        counts = {f.id: len(req.tenant.where(world.posts, "forum_id", f.id)) for f in all_forums}
        return req.render("forum/forums.html", forums=all_forums, counts=counts)

    async def forum(req: Req) -> Response:
        found = forum_by_name(req.tenant, world, req.request.path_params["forum"])
        if found is None:
            return req.not_found("No such forum.")
        sort = req.arg("sort", "hot")
        sort = sort if sort in FORUM_SORTS else "hot"
        subscribed = req.user is not None and any(
            s.forum_id == found.id
            for s in req.tenant.where(world.subscriptions, "username", req.user)
        )
        return req.render(
            "forum/forum.html",
            forum=found,
            sort=sort,
            sorts=FORUM_SORTS,
            subscribed=subscribed,
            **listing(req, forum_posts(req.tenant, world, found.id, sort)),
        )

    async def subscribe(req: Req) -> Response:
        user = req.require_login()
        found = forum_by_name(req.tenant, world, req.request.path_params["forum"])
        if found is None:
            return req.not_found("No such forum.")
        mine = [
            s
            for s in req.tenant.where(world.subscriptions, "username", user)
            if s.forum_id == found.id
        ]
        if mine:
            req.tenant.delete(world.subscriptions, mine[0].id)
            req.flash(f"You unsubscribed from {found.name}.")
        else:
            req.tenant.insert(
                world.subscriptions,
                lambda new_id: Subscription(id=new_id, forum_id=found.id, username=user),
            )
            req.flash(f"You subscribed to {found.name}.")
        raise Redirect(f"/f/{found.name}")

    async def subscriptions(req: Req) -> Response:
        user = req.require_login()
        mine = req.tenant.where(world.subscriptions, "username", user)
        subscribed = [f for s in mine if (f := req.tenant.get(world.forums, s.forum_id))]
        return req.render(
            "forum/subscriptions.html", forums=sorted(subscribed, key=lambda f: f.name)
        )

    async def post(req: Req) -> Response:
        found = find_post(req)
        if found is None:
            return req.not_found("No such submission.")
        forum_row, item = found
        comments = req.tenant.where(world.comments, "post_id", item.id)
        vote = 0
        if req.user:
            votes = [
                v
                for v in req.tenant.where(world.votes, "post_id", item.id)
                if v.username == req.user
            ]
            vote = votes[0].value if votes else 0
        return req.render(
            "forum/post.html", forum=forum_row, post=item, comments=comments, vote=vote
        )

    async def vote(req: Req) -> Response:
        user = req.require_login()
        found = find_post(req)
        if found is None:
            return req.not_found("No such submission.")
        forum_row, item = found
        wanted = 1 if (await req.form()).get("direction") == "up" else -1
        mine = [v for v in req.tenant.where(world.votes, "post_id", item.id) if v.username == user]
        old = mine[0].value if mine else 0
        new = 0 if old == wanted else wanted
        if mine:
            req.tenant.delete(world.votes, mine[0].id)
        if new:
            req.tenant.insert(
                world.votes,
                lambda new_id: Vote(id=new_id, post_id=item.id, username=user, value=new),
            )
        req.tenant.put(world.posts, msgspec.structs.replace(item, score=item.score + new - old))
        raise Redirect(f"/f/{forum_row.name}/{item.id}")

    async def comment(req: Req) -> Response:
        user = req.require_login()
        found = find_post(req)
        if found is None:
            return req.not_found("No such submission.")
        forum_row, item = found
        text = (await req.form()).get("comment", "")
        if not text:
            req.flash("Your comment is empty.")
        else:
            req.tenant.insert(
                world.comments,
                lambda new_id: Comment(
                    id=new_id, post_id=item.id, author=user, body=text, score=1, created=NOW
                ),
            )
            req.flash("Your comment was posted.")
        raise Redirect(f"/f/{forum_row.name}/{item.id}")

    async def edit_page(req: Req) -> Response:
        user = req.require_login()
        found = find_post(req)
        if found is None or found[1].author != user:
            return req.not_found("No such submission of yours.")
        return req.render("forum/edit.html", forum=found[0], post=found[1], error="")

    async def edit_save(req: Req) -> Response:
        user = req.require_login()
        found = find_post(req)
        if found is None or found[1].author != user:
            return req.not_found("No such submission of yours.")
        forum_row, item = found
        form = await req.form()
        if not form.get("title"):
            return req.render(
                "forum/edit.html",
                status=400,
                forum=forum_row,
                post=item,
                error="A title is needed.",
            )
        changed = msgspec.structs.replace(
            item, title=form["title"], body=form.get("body", ""), edited=True
        )
        req.tenant.put(world.posts, changed)
        req.flash("The submission was edited.")
        raise Redirect(f"/f/{forum_row.name}/{item.id}")

    async def submit_page(req: Req) -> Response:
        req.require_login()
        all_forums = sorted(req.tenant.all(world.forums), key=lambda f: f.name)
        return req.render("forum/submit.html", forums=all_forums, error="", form={})

    async def submit(req: Req) -> Response:
        user = req.require_login()
        form = await req.form()
        target = forum_by_name(req.tenant, world, form.get("forum", ""))
        if target is None or not form.get("title"):
            all_forums = sorted(req.tenant.all(world.forums), key=lambda f: f.name)
            return req.render(
                "forum/submit.html",
                status=400,
                forums=all_forums,
                error="Choose a forum and enter a title.",
                form=form,
            )
        created = req.tenant.insert(
            world.posts,
            lambda new_id: Post(
                id=new_id,
                forum_id=target.id,
                author=user,
                title=form["title"],
                body=form.get("body", ""),
                score=1,
                created=NOW,
            ),
        )
        raise Redirect(f"/f/{target.name}/{created.id}")

    async def user_page(req: Req) -> Response:
        name = req.request.path_params["username"]
        if not req.tenant.where(world.forum_users, "username", name):
            return req.not_found("No such user.")
        posts = user_posts(req.tenant, world, name)
        comments = user_comments(req.tenant, world, name)
        forums = {f.id: f for f in req.tenant.all(world.forums)}
        parents = {c.post_id: req.tenant.get(world.posts, c.post_id) for c in comments}
        return req.render(
            "forum/user.html",
            username=name,
            joined=req.tenant.where(world.forum_users, "username", name)[0].joined,
            posts=posts,
            comments=comments,
            forums=forums,
            parents=parents,
        )

    site.add("/", home)
    site.add("/forums", forums)
    site.add("/subscriptions", subscriptions)
    site.add("/submit", submit_page)
    site.add("/submit", submit, methods=["POST"])
    site.add("/user/{username}", user_page)
    site.add("/f/{forum}", forum)
    site.add("/f/{forum}/subscribe", subscribe, methods=["POST"])
    site.add("/f/{forum}/{post_id:int}", post)
    site.add("/f/{forum}/{post_id:int}/vote", vote, methods=["POST"])
    site.add("/f/{forum}/{post_id:int}/comment", comment, methods=["POST"])
    site.add("/f/{forum}/{post_id:int}/edit", edit_page)
    site.add("/f/{forum}/{post_id:int}/edit", edit_save, methods=["POST"])
    return site
