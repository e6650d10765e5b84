"""Task templates of the forum (REDDIT): ids 301-399."""

from __future__ import annotations

import random

from runtime.base.messages import OracleStep
from sites.builtin import words
from sites.builtin.data import ACCOUNTS, World
from sites.builtin.forum import FORUM_SORTS, POSTS_PER_PAGE, forum_posts, user_posts
from sites.builtin.records import Forum, Post
from sites.builtin.template_kit import (
    Built,
    Template,
    button,
    exit_with,
    link,
    next_pages,
    program_html,
    select,
    string_match,
    type_into,
    url_match,
)
from sites.builtin.tenants import Tenant

__all__ = ["TEMPLATES"]

SITE = "reddit"
USER = ACCOUNTS[SITE].username


def _forum(world: World, base: Tenant, name: str) -> Forum:
    found = [f for f in base.all(world.forums) if f.name == name]
    if not found:
        raise ValueError(f"no forum {name!r}")
    return found[0]


def _post(world: World, base: Tenant, forum: Forum, title: str) -> tuple[int, Post]:
    """The post and its index in the forum's default (Hot) listing."""
    for index, post in enumerate(forum_posts(base, world, forum.id)):
        if post.title == title:
            return index, post
    raise ValueError(f"no post {title!r} in {forum.name}")


def _forums(world: World, base: Tenant) -> list[dict[str, str]]:
    return [{"forum": f.name} for f in base.all(world.forums)]


def _posts(world: World, base: Tenant) -> list[dict[str, str]]:
    return [
        {"forum": f.name, "title": p.title}
        for f in base.all(world.forums)
        for p in forum_posts(base, world, f.id)
    ]


def _to_post_listing(forum: str, index: int) -> list[OracleStep]:
    return [
        link("Forums", "Open the list of forums."),
        link(forum, f"Open the {forum} forum."),
        *next_pages(index, POSTS_PER_PAGE, "The post"),
    ]


def _to_post(forum: str, title: str, index: int) -> list[OracleStep]:
    return [*_to_post_listing(forum, index), link(title, "Open the post.")]


def _open_forum(world: World, base: Tenant, p: dict[str, str]) -> Built:
    forum = _forum(world, base, p["forum"])
    return Built(
        intent=f"Open the {forum.name} forum.",
        start="/",
        eval=url_match(SITE, f"/f/{forum.name}"),
        plan=[
            link("Forums", "Open the list of forums."),
            link(forum.name, f"Open the {forum.name} forum."),
            exit_with("", "The forum is open."),
        ],
    )


def _first_page_posts(world: World, base: Tenant) -> list[dict[str, str]]:
    return [
        {"forum": f.name, "title": p.title}
        for f in base.all(world.forums)
        for p in forum_posts(base, world, f.id)[:POSTS_PER_PAGE]
    ]


def _score_here(world: World, base: Tenant, p: dict[str, str]) -> Built:
    forum = _forum(world, base, p["forum"])
    _, post = _post(world, base, forum, p["title"])
    return Built(
        intent=f"What is the score of the post '{post.title}'?",
        start=f"/f/{forum.name}",
        eval=string_match(exact=str(post.score)),
        plan=[exit_with(str(post.score), f"The listing shows score {post.score} for it.")],
    )


def _author(world: World, base: Tenant, p: dict[str, str]) -> Built:
    forum = _forum(world, base, p["forum"])
    index, post = _post(world, base, forum, p["title"])
    return Built(
        intent=f"Who submitted the post '{post.title}' in the {forum.name} forum?",
        start="/",
        eval=string_match(exact=post.author),
        plan=[
            *_to_post_listing(forum.name, index),
            exit_with(post.author, f"It was submitted by {post.author}."),
        ],
    )


def _comment_count(world: World, base: Tenant, p: dict[str, str]) -> Built:
    forum = _forum(world, base, p["forum"])
    index, post = _post(world, base, forum, p["title"])
    count = str(len(base.where(world.comments, "post_id", post.id)))
    return Built(
        intent=f"How many comments does the post '{post.title}' in the {forum.name} forum have?",
        start="/",
        eval=string_match(exact=count),
        plan=[
            *_to_post_listing(forum.name, index),
            exit_with(count, f"The listing shows {count} comments."),
        ],
    )


def _sorted_first(world: World, base: Tenant, sort: str) -> list[dict[str, str]]:
    found = []
    for forum in base.all(world.forums):
        posts = forum_posts(base, world, forum.id, sort)
        if len(posts) < 2 or (sort == "top" and posts[0].score == posts[1].score):
            continue
        if sort == "new" and posts[0].created == posts[1].created:
            continue
        found.append({"forum": forum.name})
    return found


def _top_post(world: World, base: Tenant, p: dict[str, str], sort: str, what: str) -> Built:
    forum = _forum(world, base, p["forum"])
    first = forum_posts(base, world, forum.id, sort)[0]
    return Built(
        intent=f"What is the title of the {what} post in the {forum.name} forum?",
        start="/",
        eval=string_match(exact=first.title),
        plan=[
            link("Forums", "Open the list of forums."),
            link(forum.name, f"Open the {forum.name} forum."),
            link(FORUM_SORTS[sort], f"Sort the posts by {FORUM_SORTS[sort]}."),
            exit_with(first.title, f"The first post is '{first.title}'."),
        ],
    )


def _posts_by_authors(world: World, base: Tenant) -> list[dict[str, str]]:
    """One post per author (its first in id order), to start from."""
    seen: dict[str, dict[str, str]] = {}
    for post in base.all(world.posts):
        if post.author not in seen:
            forum = base.get(world.forums, post.forum_id)
            assert forum is not None
            seen[post.author] = {"user": post.author, "forum": forum.name, "post": str(post.id)}
    return list(seen.values())


def _user_submissions(world: World, base: Tenant, p: dict[str, str]) -> Built:
    count = str(len(user_posts(base, world, p["user"])))
    return Built(
        intent=f"How many submissions has {p['user']}, the author of this post, made?",
        start=f"/f/{p['forum']}/{int(p['post'])}",
        eval=string_match(exact=count),
        plan=[
            link(p["user"], f"Open the user page of {p['user']}."),
            exit_with(count, f"The user page lists {count} submissions."),
        ],
    )


def _new_post_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    rng = random.Random(f"{world.seed}:forum-submit")
    found = []
    for forum in base.all(world.forums):
        existing = {p.title for p in forum_posts(base, world, forum.id)}
        topics = words.TOPIC_WORDS[forum.name]
        for _ in range(8):
            title = rng.choice(words.POST_TEMPLATES).format(
                subject=rng.choice(words.POST_SUBJECTS), topic=rng.choice(topics)
            )
            if title in existing:
                continue
            existing.add(title)
            body = f"{rng.choice(words.COMMENT_OPENERS)} My {rng.choice(topics)} story."
            found.append({"forum": forum.name, "title": title, "body": body})
    return found


def _submit(world: World, base: Tenant, p: dict[str, str]) -> Built:
    forum = _forum(world, base, p["forum"])
    new_id = world.posts.next_id
    return Built(
        intent=f"Create a post in the {forum.name} forum titled '{p['title']}' "
        f"with the body '{p['body']}'.",
        start="/",
        eval=program_html(
            SITE,
            [
                (
                    f"/f/{forum.name}/{new_id}",
                    "document.querySelector('#post-title')?.outerText ?? ''",
                    {"exact_match": p["title"]},
                ),
                (
                    f"/f/{forum.name}/{new_id}",
                    "document.querySelector('#post-body')?.outerText ?? ''",
                    {"must_include": [p["body"]]},
                ),
            ],
        ),
        plan=[
            link("Submit", "Open the submission form."),
            select("forum", forum.name, f"Choose the {forum.name} forum."),
            type_into("title", p["title"], "Enter the title."),
            type_into("body", p["body"], "Enter the body.", tag="textarea"),
            button("Create Submission", "Submit the post."),
            exit_with("", "The post is created."),
        ],
        require_login=True,
        require_reset=True,
    )


def _reply_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    rng = random.Random(f"{world.seed}:forum-reply")
    return [
        {**p, "comment": f"{rng.choice(words.COMMENT_OPENERS)} Thanks from {USER}."}
        for p in _posts(world, base)
    ]


def _reply(world: World, base: Tenant, p: dict[str, str]) -> Built:
    forum = _forum(world, base, p["forum"])
    index, post = _post(world, base, forum, p["title"])
    last = "[...document.querySelectorAll('#comments li')].pop()?.outerText ?? ''"
    return Built(
        intent=f"Reply to the post '{post.title}' in the {forum.name} forum with the comment "
        f"'{p['comment']}'.",
        start="/",
        eval=program_html(
            SITE,
            [(f"/f/{forum.name}/{post.id}", last, {"must_include": [USER, p["comment"]]})],
        ),
        plan=[
            *_to_post(forum.name, post.title, index),
            type_into("comment", p["comment"], "Write the comment.", tag="textarea"),
            button("Post Comment", "Post the comment."),
            exit_with("", "The comment is posted."),
        ],
        require_login=True,
        require_reset=True,
    )


def _upvote(world: World, base: Tenant, p: dict[str, str]) -> Built:
    forum = _forum(world, base, p["forum"])
    index, post = _post(world, base, forum, p["title"])
    url = f"/f/{forum.name}/{post.id}"
    return Built(
        intent=f"Upvote the post '{post.title}' in the {forum.name} forum.",
        start="/",
        eval=program_html(
            SITE,
            [
                (
                    url,
                    "document.querySelector('#vote-state')?.outerText ?? ''",
                    {"exact_match": "You upvoted this."},
                ),
                (
                    url,
                    "document.querySelector('#post-score').outerText",
                    {"exact_match": str(post.score + 1)},
                ),
            ],
        ),
        plan=[
            *_to_post(forum.name, post.title, index),
            button("Upvote", "Upvote the post."),
            exit_with("", "The post is upvoted."),
        ],
        require_login=True,
        require_reset=True,
    )


def _unsubscribed(world: World, base: Tenant) -> list[dict[str, str]]:
    mine = {s.forum_id for s in base.where(world.subscriptions, "username", USER)}
    return [{"forum": f.name} for f in base.all(world.forums) if f.id not in mine]


def _subscribe(world: World, base: Tenant, p: dict[str, str]) -> Built:
    forum = _forum(world, base, p["forum"])
    return Built(
        intent=f"Subscribe to the {forum.name} forum.",
        start="/",
        eval=program_html(
            SITE,
            [
                (
                    "/subscriptions",
                    "document.querySelector('#subscribed-forums').outerText",
                    {"must_include": [forum.name]},
                )
            ],
        ),
        plan=[
            link("Forums", "Open the list of forums."),
            link(forum.name, f"Open the {forum.name} forum."),
            button("Subscribe", "Subscribe to the forum."),
            exit_with("", "I am subscribed."),
        ],
        require_login=True,
        require_reset=True,
    )


def _own_posts(world: World, base: Tenant) -> list[dict[str, str]]:
    rng = random.Random(f"{world.seed}:forum-edit")
    found = []
    for post in base.where(world.posts, "author", USER):
        forum = base.get(world.forums, post.forum_id)
        assert forum is not None
        for _ in range(3):
            suffix = rng.choice(("update", "edited", "revisited", "part 2"))
            new = f"{post.title.rstrip('?')} ({suffix})"
            found.append({"forum": forum.name, "title": post.title, "new_title": new})
    unique = {tuple(sorted(c.items())): c for c in found}
    return list(unique.values())


def _edit_title(world: World, base: Tenant, p: dict[str, str]) -> Built:
    forum = _forum(world, base, p["forum"])
    index, post = _post(world, base, forum, p["title"])
    return Built(
        intent=f"Change the title of my post '{post.title}' in the {forum.name} forum to "
        f"'{p['new_title']}'.",
        start="/",
        eval=program_html(
            SITE,
            [
                (
                    f"/f/{forum.name}/{post.id}",
                    "document.querySelector('#post-title').outerText",
                    {"exact_match": p["new_title"]},
                )
            ],
        ),
        plan=[
            *_to_post(forum.name, post.title, index),
            link("Edit submission", "Open the edit form."),
            type_into("title", p["new_title"], "Enter the new title."),
            button("Save Changes", "Save the changes."),
            exit_with("", "The title is changed."),
        ],
        require_login=True,
        require_reset=True,
    )


TEMPLATES = [
    Template(301, SITE, "open_forum", "Open the {forum} forum.", _forums, _open_forum),
    Template(
        302,
        SITE,
        "post_score_here",
        "What is the score of the post '{title}'?",
        _first_page_posts,
        _score_here,
        train_cap=50,
    ),
    Template(
        303,
        SITE,
        "post_author",
        "Who submitted the post '{title}' in the {forum} forum?",
        _posts,
        _author,
        train_cap=40,
    ),
    Template(
        304,
        SITE,
        "comment_count",
        "How many comments does the post '{title}' in the {forum} forum have?",
        _posts,
        _comment_count,
        train_cap=40,
    ),
    Template(
        305,
        SITE,
        "top_post",
        "What is the title of the top-scoring post in the {forum} forum?",
        lambda w, b: _sorted_first(w, b, "top"),
        lambda w, b, p: _top_post(w, b, p, "top", "top-scoring"),
    ),
    Template(
        306,
        SITE,
        "user_submissions",
        "How many submissions has {user}, the author of this post, made?",
        _posts_by_authors,
        _user_submissions,
        train_cap=40,
    ),
    Template(
        307,
        SITE,
        "submit_post",
        "Create a post in the {forum} forum titled '{title}' with the body '{body}'.",
        _new_post_candidates,
        _submit,
    ),
    Template(
        308,
        SITE,
        "reply",
        "Reply to the post '{title}' in the {forum} forum with the comment '{comment}'.",
        _reply_candidates,
        _reply,
    ),
    Template(
        309, SITE, "upvote", "Upvote the post '{title}' in the {forum} forum.", _posts, _upvote
    ),
    Template(
        310,
        SITE,
        "subscribe",
        "Subscribe to the {forum} forum.",
        _unsubscribed,
        _subscribe,
        ood=True,
        train_cap=12,
    ),
    Template(
        311,
        SITE,
        "newest_post",
        "What is the title of the newest post in the {forum} forum?",
        lambda w, b: _sorted_first(w, b, "new"),
        lambda w, b, p: _top_post(w, b, p, "new", "newest"),
        ood=True,
        train_cap=12,
    ),
    Template(
        312,
        SITE,
        "edit_title",
        "Change the title of my post '{title}' in the {forum} forum to '{new_title}'.",
        _own_posts,
        _edit_title,
    ),
]
