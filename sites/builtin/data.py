"""The seeded data of the five built-in sites: `build_world(seed)`.

Deterministic: the same seed gives the same rows (one `random.Random` per site, seeded
from a string). Sizes with seed 0 (docs/sites.md counts them): 240 products in 10
categories, 70 customers, 130 orders; 22 forums, 364 posts, 1050 comments; 18 projects,
371 issues; 63 places. Built in well under a
second, cached per seed, immutable afterwards (tenants write to their own overlay).
"""

from __future__ import annotations

import datetime as dt
import functools
import random
import string

import msgspec

from sites.builtin import words
from sites.builtin.records import (
    CartLine,
    Category,
    CodeUser,
    Comment,
    Commit,
    Customer,
    Forum,
    ForumUser,
    Issue,
    IssueNote,
    Member,
    MergeRequest,
    Order,
    OrderItem,
    Place,
    Post,
    Product,
    Project,
    Review,
    Star,
    Subscription,
    Vote,
)
from sites.builtin.tenants import Table

__all__ = [
    "ACCOUNTS",
    "NOW",
    "ORDER_STATUSES",
    "ROLES",
    "SHIPPING",
    "TODAY",
    "Account",
    "World",
    "build_world",
]


class Account(msgspec.Struct, frozen=True, kw_only=True):
    """A default account of a site: the one tasks log in with."""

    username: str
    password: str


# Task site name -> its default account (WebArena's account names; map has none).
ACCOUNTS: dict[str, Account] = {
    "shopping": Account(username="emma.lopez@example.com", password="Password.123"),
    "shopping_admin": Account(username="admin", password="admin1234"),
    "reddit": Account(username="MarvelsGrandpa17", password="test1234"),
    "gitlab": Account(username="byteblaze", password="hello1234"),
}

# The sites' "today": every date in the seeded data is earlier; new rows carry it.
TODAY = "2024-02-01"
NOW = f"{TODAY} 12:00"

# Shipping methods of the shop's checkout: name -> cost in cents.
SHIPPING: dict[str, int] = {"Flat Rate": 500, "Express": 1500, "Free Shipping": 0}

ORDER_STATUSES = ("Pending", "Processing", "Complete", "Canceled")
# Complete twice as often as the others.
_STATUS_WEIGHTS = ("Pending", "Processing", "Complete", "Complete", "Canceled")
ROLES = ("Guest", "Reporter", "Developer", "Maintainer", "Owner")


class World:
    """Every seeded table of the five sites."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.categories: Table[Category]
        self.products: Table[Product]
        self.reviews: Table[Review]
        self.customers: Table[Customer]
        self.orders: Table[Order]
        self.cart: Table[CartLine] = Table("cart", [])
        self.forums: Table[Forum]
        self.forum_users: Table[ForumUser]
        self.posts: Table[Post]
        self.comments: Table[Comment]
        self.votes: Table[Vote] = Table("votes", [])
        self.subscriptions: Table[Subscription]
        self.code_users: Table[CodeUser]
        self.projects: Table[Project]
        self.members: Table[Member]
        self.issues: Table[Issue]
        self.notes: Table[IssueNote] = Table("notes", [])
        self.merge_requests: Table[MergeRequest]
        self.commits: Table[Commit]
        self.stars: Table[Star]
        self.places: Table[Place]
        _build_shop(self, random.Random(f"{seed}:shop"))
        _build_forum(self, random.Random(f"{seed}:forum"))
        _build_code(self, random.Random(f"{seed}:code"))
        _build_map(self, random.Random(f"{seed}:map"))

    def sizes(self) -> dict[str, int]:
        """Rows per table."""
        return {name: len(table) for name, table in vars(self).items() if isinstance(table, Table)}


@functools.lru_cache(maxsize=4)
def build_world(seed: int) -> World:
    """The seeded data for `seed` (cached: the world is immutable)."""
    return World(seed)


def _date(rng: random.Random, start: dt.date, days: int) -> dt.date:
    return start + dt.timedelta(days=rng.randrange(days))


def _stamp(rng: random.Random, start: dt.date, days: int) -> str:
    day = _date(rng, start, days)
    return f"{day.isoformat()} {rng.randrange(7, 23):02d}:{rng.randrange(60):02d}"


# --------------------------------------------------------------------------- shop


def _build_shop(world: World, rng: random.Random) -> None:
    categories = [
        Category(id=i + 1, slug=slug, name=name)
        for i, (name, slug, _) in enumerate(words.NOUNS_BY_CATEGORY)
    ]
    products: list[Product] = []
    skus: set[str] = set()
    for category, (_, _, nouns) in zip(categories, words.NOUNS_BY_CATEGORY, strict=True):
        names: set[str] = set()
        base_price = rng.choice((900, 1500, 2500, 4000))
        while len(names) < 24:
            name = f"{rng.choice(words.BRANDS)} {rng.choice(words.ADJECTIVES)} {rng.choice(nouns)}"
            if name in names:
                continue
            names.add(name)
            sku = "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(7))
            while sku in skus:
                sku = "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(7))
            skus.add(sku)
            color = rng.choice(words.COLORS)
            products.append(
                Product(
                    id=len(products) + 1,
                    sku=sku,
                    name=name,
                    category_id=category.id,
                    price_cents=rng.randrange(base_price // 300, base_price // 25) * 100
                    + rng.choice((0, 49, 95, 99)),
                    description=f"A {color.lower()} {name.split(' ', 1)[1].lower()} by "
                    f"{name.split(' ', 1)[0]}. Color: {color}.",
                    quantity=rng.choice((0, *range(5, 200))),
                )
            )
    reviews: list[Review] = []
    for product in products:
        for _ in range(rng.choice((0, 1, 1, 2, 2, 3, 3, 4, 5, 6))):
            rating = rng.choice((1, 2, 3, 3, 4, 4, 4, 5, 5, 5))
            reviews.append(
                Review(
                    id=len(reviews) + 1,
                    product_id=product.id,
                    author=f"{rng.choice(words.FIRST_NAMES)} {rng.choice(words.LAST_NAMES)[0]}.",
                    rating=rating,
                    title=rng.choice(words.REVIEW_TITLES),
                    text=f"I rated it {rating} out of 5. {rng.choice(words.COMMENT_OPENERS)}",
                    date=_date(rng, dt.date(2021, 1, 1), 1000).isoformat(),
                )
            )
    customers: list[Customer] = []
    seen_names: set[tuple[str, str]] = {("Emma", "Lopez")}
    customers.append(_customer(rng, 1, "Emma", "Lopez", "emma.lopez@example.com"))
    while len(customers) < 70:
        first, last = rng.choice(words.FIRST_NAMES), rng.choice(words.LAST_NAMES)
        if (first, last) in seen_names:
            continue
        seen_names.add((first, last))
        email = f"{first.lower()}.{last.lower()}@example.com"
        customers.append(_customer(rng, len(customers) + 1, first, last, email))
    dates = sorted(_date(rng, dt.date(2022, 1, 1), 730) for _ in range(130))
    orders: list[Order] = []
    for index, day in enumerate(dates):
        # Emma (customer 1) placed every ninth order: about 14 in her history.
        customer_id = 1 if index % 9 == 4 else rng.randrange(2, len(customers) + 1)
        chosen = rng.sample(products, rng.choice((1, 1, 2, 2, 3, 4)))
        shipping = rng.choice(tuple(SHIPPING))
        orders.append(
            Order(
                id=1001 + index,
                customer_id=customer_id,
                date=day.isoformat(),
                status=rng.choice(_STATUS_WEIGHTS),
                shipping=shipping,
                shipping_cents=SHIPPING[shipping],
                items=tuple(
                    OrderItem(
                        product_id=p.id,
                        name=p.name,
                        sku=p.sku,
                        price_cents=p.price_cents,
                        qty=rng.choice((1, 1, 1, 2, 3)),
                    )
                    for p in chosen
                ),
            )
        )
    world.categories = Table("categories", categories)
    world.products = Table("products", products)
    world.reviews = Table("reviews", reviews)
    world.customers = Table("customers", customers)
    world.orders = Table("orders", orders)


def _customer(rng: random.Random, cid: int, first: str, last: str, email: str) -> Customer:
    city, state = rng.choice(words.CITIES)
    return Customer(
        id=cid,
        first_name=first,
        last_name=last,
        email=email,
        phone=f"412-{rng.randrange(200, 999)}-{rng.randrange(1000, 9999)}",
        street=f"{rng.randrange(10, 999)} {rng.choice(words.STREETS)}",
        city=city,
        state=state,
        zip=f"{rng.randrange(10000, 99999)}",
    )


# --------------------------------------------------------------------------- forum


def _build_forum(world: World, rng: random.Random) -> None:
    users = ["MarvelsGrandpa17"]
    while len(users) < 60:
        adjective, creature = rng.choice(words.USER_ADJECTIVES), rng.choice(words.CREATURES)
        name = f"{adjective}{creature}{rng.randrange(10, 99)}"
        if name not in users:
            users.append(name)
    forums = [
        Forum(id=i + 1, name=name, title=title, description=f"All about {title.lower()}.")
        for i, (name, title) in enumerate(words.FORUMS)
    ]
    posts: list[Post] = []
    comments: list[Comment] = []
    for forum in forums:
        topics = words.TOPIC_WORDS[forum.name]
        titles: set[str] = set()
        for _ in range(rng.randrange(12, 22)):
            title = rng.choice(words.POST_TEMPLATES).format(
                subject=rng.choice(words.POST_SUBJECTS), topic=rng.choice(topics)
            )
            if title in titles:
                continue
            titles.add(title)
            author = users[0] if rng.random() < 0.06 else rng.choice(users[1:])
            post = Post(
                id=len(posts) + 1,
                forum_id=forum.id,
                author=author,
                title=title,
                body=f"{title} {rng.choice(words.COMMENT_OPENERS)} I keep thinking about "
                f"{rng.choice(topics)} and {rng.choice(topics)}.",
                score=int(rng.paretovariate(1.2) * 3) - rng.randrange(6),
                created=_stamp(rng, dt.date(2023, 1, 1), 360),
            )
            posts.append(post)
            for _ in range(rng.choice((0, 1, 2, 2, 3, 3, 4, 5, 6))):
                comments.append(
                    Comment(
                        id=len(comments) + 1,
                        post_id=post.id,
                        author=rng.choice(users),
                        body=f"{rng.choice(words.COMMENT_OPENERS)} The {rng.choice(topics)} "
                        f"part was {rng.choice(('great', 'odd', 'useful', 'funny'))}.",
                        score=rng.randrange(-3, 40),
                        created=_stamp(rng, dt.date(2024, 1, 1), 30),
                    )
                )
    world.forum_users = Table(
        "forum_users",
        [
            ForumUser(
                id=i + 1, username=u, joined=_date(rng, dt.date(2019, 1, 1), 1400).isoformat()
            )
            for i, u in enumerate(users)
        ],
    )
    world.forums = Table("forums", forums)
    world.posts = Table("posts", posts)
    world.comments = Table("comments", comments)
    subscribed = rng.sample(forums, 5)
    world.subscriptions = Table(
        "subscriptions",
        [
            Subscription(id=i + 1, forum_id=f.id, username=users[0])
            for i, f in enumerate(sorted(subscribed, key=lambda f: f.id))
        ],
    )


# --------------------------------------------------------------------------- code


def _build_code(world: World, rng: random.Random) -> None:
    users = [CodeUser(id=1, username="byteblaze", name="Byte Blaze")]
    user_names = {"byteblaze"}
    for namespace in ("kilian", "rustacean"):
        users.append(CodeUser(id=len(users) + 1, username=namespace, name=namespace.title()))
        user_names.add(namespace)
    while len(users) < 30:
        first, last = rng.choice(words.FIRST_NAMES), rng.choice(words.LAST_NAMES)
        username = f"{first.lower()}_{last.lower()}"
        if username in user_names:
            continue
        user_names.add(username)
        users.append(CodeUser(id=len(users) + 1, username=username, name=f"{first} {last}"))
    others = [u.username for u in users[3:]]
    projects: list[Project] = []
    members: list[Member] = []
    issues: list[Issue] = []
    mrs: list[MergeRequest] = []
    commits: list[Commit] = []
    for namespace, name, description in words.PROJECT_WORDS:
        project = Project(
            id=len(projects) + 1,
            namespace=namespace,
            name=name,
            description=description,
            stars=rng.randrange(0, 400),
            default_branch=rng.choice(("main", "main", "master")),
            labels=tuple(sorted(rng.sample(words.LABELS, 4))),
            created=_date(rng, dt.date(2018, 1, 1), 1500).isoformat(),
        )
        projects.append(project)
        owner = namespace if namespace in user_names else rng.choice(others)
        team = {owner: "Owner"}
        if "byteblaze" not in team and rng.random() < 0.7:
            team["byteblaze"] = rng.choice(("Developer", "Maintainer"))
        for username in rng.sample(others, rng.randrange(2, 6)):
            team.setdefault(username, rng.choice(ROLES[:4]))
        for username, role in sorted(team.items()):
            members.append(
                Member(id=len(members) + 1, project_id=project.id, username=username, role=role)
            )
        team_names = sorted(team)
        titles: set[str] = set()
        for _ in range(rng.randrange(12, 29)):
            title = rng.choice(words.ISSUE_PROBLEMS).format(area=rng.choice(words.ISSUE_AREAS))
            if title in titles:
                continue
            titles.add(title)
            issues.append(
                Issue(
                    id=len(issues) + 1,
                    project_id=project.id,
                    iid=len(titles),
                    title=title,
                    description=f"{title}. Seen on {rng.choice(words.ISSUE_AREAS)} too.",
                    state="opened" if rng.random() < 0.6 else "closed",
                    author=rng.choice(team_names),
                    assignee=rng.choice(("", *team_names)),
                    labels=tuple(sorted(rng.sample(project.labels, rng.choice((0, 1, 1, 2))))),
                    created=_stamp(rng, dt.date(2022, 6, 1), 540),
                )
            )
        mr_titles: set[str] = set()
        for _ in range(rng.randrange(3, 9)):
            word, area = rng.choice(words.BRANCH_WORDS), rng.choice(words.ISSUE_AREAS)
            title = f"{word.title()}: {area}"
            if title in mr_titles:
                continue
            mr_titles.add(title)
            mrs.append(
                MergeRequest(
                    id=len(mrs) + 1,
                    project_id=project.id,
                    iid=len(mr_titles),
                    title=title,
                    source_branch=f"{word}/{area.replace(' ', '-')}",
                    target_branch=rng.choice(
                        (project.default_branch, project.default_branch, "develop")
                    ),
                    author=rng.choice(team_names),
                    state=rng.choice(("opened", "opened", "merged", "closed")),
                    created=_stamp(rng, dt.date(2023, 1, 1), 360),
                )
            )
        stamps = sorted(
            {_stamp(rng, dt.date(2023, 1, 1), 365) for _ in range(rng.randrange(12, 26))}
        )
        for stamp in stamps:
            commits.append(
                Commit(
                    id=len(commits) + 1,
                    project_id=project.id,
                    sha="".join(rng.choice("0123456789abcdef") for _ in range(40)),
                    message=f"{rng.choice(words.COMMIT_VERBS)} {rng.choice(words.ISSUE_AREAS)}",
                    author=rng.choice(team_names),
                    date=stamp,
                )
            )
    starred = rng.sample(projects, 3)
    world.code_users = Table("code_users", users)
    world.projects = Table("projects", projects)
    world.members = Table("members", members)
    world.issues = Table("issues", issues)
    world.merge_requests = Table("merge_requests", mrs)
    world.commits = Table("commits", commits)
    world.stars = Table(
        "stars",
        [Star(id=i + 1, project_id=p.id, username="byteblaze") for i, p in enumerate(starred)],
    )


# --------------------------------------------------------------------------- map


def _build_map(world: World, rng: random.Random) -> None:
    places: list[Place] = []
    names: set[str] = set()
    for kind, suffixes in words.PLACE_KINDS:
        while sum(p.category == kind for p in places) < 6 + (
            kind in ("Cafe", "Park", "Restaurant")
        ):
            name = f"{rng.choice(words.LAST_NAMES)} {rng.choice(suffixes)}"
            if name in names:
                continue
            names.add(name)
            places.append(
                Place(
                    id=len(places) + 1,
                    name=name,
                    category=kind,
                    street=f"{rng.randrange(10, 2999)} {rng.choice(words.STREETS)}",
                    city="Pittsburgh",
                    lat=round(rng.uniform(40.40, 40.49), 4),
                    lon=round(rng.uniform(-80.04, -79.90), 4),
                )
            )
    world.places = Table("places", places)
