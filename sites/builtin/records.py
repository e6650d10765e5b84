"""The rows of the built-in sites' tables: frozen msgspec Structs with an integer `id`.

Rows are never mutated: an edit stores a changed copy (`msgspec.structs.replace`) in the
tenant's overlay (see `tenants.py`). Money is kept in cents, dates as ISO strings.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "CartLine",
    "Category",
    "CodeUser",
    "Comment",
    "Commit",
    "Customer",
    "Forum",
    "ForumUser",
    "Issue",
    "IssueNote",
    "Member",
    "MergeRequest",
    "Order",
    "OrderItem",
    "Place",
    "Post",
    "Product",
    "Project",
    "Record",
    "Review",
    "Star",
    "Subscription",
    "Vote",
    "money",
]


def money(cents: int) -> str:
    """`1234` -> `"$12.34"`."""
    return f"${cents // 100:,}.{cents % 100:02d}"


class Record(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every row."""

    id: int


# --------------------------------------------------------------------------- shop/admin


class Category(Record, frozen=True):
    slug: str
    name: str


class Product(Record, frozen=True):
    sku: str
    name: str
    category_id: int
    price_cents: int
    description: str
    quantity: int
    enabled: bool = True


class Review(Record, frozen=True):
    product_id: int
    author: str
    rating: int
    title: str
    text: str
    date: str


class Customer(Record, frozen=True):
    first_name: str
    last_name: str
    email: str
    phone: str
    street: str
    city: str
    state: str
    zip: str

    @property
    def name(self) -> str:
        return f"{self.first_name} {self.last_name}"


class OrderItem(msgspec.Struct, frozen=True, kw_only=True):
    product_id: int
    name: str
    sku: str
    price_cents: int
    qty: int


class Order(Record, frozen=True):
    customer_id: int
    date: str
    status: str
    shipping: str
    shipping_cents: int
    items: tuple[OrderItem, ...]

    @property
    def subtotal_cents(self) -> int:
        return sum(item.price_cents * item.qty for item in self.items)

    @property
    def total_cents(self) -> int:
        return self.subtotal_cents + self.shipping_cents

    @property
    def item_count(self) -> int:
        return sum(item.qty for item in self.items)


class CartLine(Record, frozen=True):
    customer_id: int
    product_id: int
    qty: int


# --------------------------------------------------------------------------- forum


class Forum(Record, frozen=True):
    name: str
    title: str
    description: str


class ForumUser(Record, frozen=True):
    username: str
    joined: str


class Post(Record, frozen=True):
    forum_id: int
    author: str
    title: str
    body: str
    score: int
    created: str
    edited: bool = False


class Comment(Record, frozen=True):
    post_id: int
    author: str
    body: str
    score: int
    created: str


class Vote(Record, frozen=True):
    post_id: int
    username: str
    value: int


class Subscription(Record, frozen=True):
    forum_id: int
    username: str


# --------------------------------------------------------------------------- code


class CodeUser(Record, frozen=True):
    username: str
    name: str


class Project(Record, frozen=True):
    namespace: str
    name: str
    description: str
    stars: int
    default_branch: str
    labels: tuple[str, ...]
    created: str

    @property
    def path(self) -> str:
        return f"{self.namespace}/{self.name}"


class Member(Record, frozen=True):
    project_id: int
    username: str
    role: str


class Issue(Record, frozen=True):
    project_id: int
    iid: int
    title: str
    description: str
    state: str
    author: str
    assignee: str
    labels: tuple[str, ...]
    created: str


class IssueNote(Record, frozen=True):
    issue_id: int
    author: str
    body: str
    created: str


class MergeRequest(Record, frozen=True):
    project_id: int
    iid: int
    title: str
    source_branch: str
    target_branch: str
    author: str
    state: str
    created: str


class Commit(Record, frozen=True):
    project_id: int
    sha: str
    message: str
    author: str
    date: str


class Star(Record, frozen=True):
    project_id: int
    username: str


# --------------------------------------------------------------------------- map


class Place(Record, frozen=True):
    name: str
    category: str
    street: str
    city: str
    lat: float
    lon: float
