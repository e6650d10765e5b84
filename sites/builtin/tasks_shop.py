"""Task templates of the shop (SHOPPING): ids 101-199."""

from __future__ import annotations

import random

from runtime.base.messages import OracleStep
from sites.builtin import words
from sites.builtin.data import ACCOUNTS, SHIPPING, World
from sites.builtin.records import Order, Product, money
from sites.builtin.shop import (
    ORDERS_PER_PAGE,
    SORTS,
    category_products,
    customer_by_email,
    customer_orders,
    rating,
    search_products,
)
from sites.builtin.template_kit import (
    Built,
    Template,
    button,
    exit_with,
    link,
    next_pages,
    program_html,
    search,
    select,
    string_match,
    type_into,
    url_match,
)
from sites.builtin.tenants import Tenant

__all__ = ["TEMPLATES"]

SITE = "shopping"


def _product(world: World, base: Tenant, name: str) -> Product:
    found = [p for p in base.all(world.products) if p.name == name]
    if not found:
        raise ValueError(f"no product named {name!r}")
    return found[0]


def _enabled(world: World, base: Tenant) -> list[dict[str, str]]:
    return [{"product": p.name} for p in base.all(world.products) if p.enabled]


def _open_product(name: str) -> list[OracleStep]:
    return [
        search("q", name, f"Search the store for {name}."),
        link(name, f"Open the product page of {name}."),
    ]


# --------------------------------------------------------------------------- lookups


def _price(world: World, base: Tenant, p: dict[str, str]) -> Built:
    product = _product(world, base, p["product"])
    price = money(product.price_cents)
    return Built(
        intent=f"What is the price of {product.name}?",
        start="/",
        eval=string_match(must_include=[price]),
        plan=[*_open_product(product.name), exit_with(price, f"The page shows the price {price}.")],
    )


def _sku(world: World, base: Tenant, p: dict[str, str]) -> Built:
    product = _product(world, base, p["product"])
    return Built(
        intent=f"What is the SKU of {product.name}?",
        start=f"/product/{product.id}",
        eval=string_match(exact=product.sku),
        plan=[exit_with(product.sku, f"This page shows {product.name} with SKU {product.sku}.")],
    )


def _review_count(world: World, base: Tenant, p: dict[str, str]) -> Built:
    product = _product(world, base, p["product"])
    count = str(rating(base, world, product.id)[1])
    return Built(
        intent=f"How many reviews does {product.name} have?",
        start="/",
        eval=string_match(exact=count),
        plan=[*_open_product(product.name), exit_with(count, f"The page lists {count} reviews.")],
    )


def _product_category(world: World, base: Tenant, p: dict[str, str]) -> Built:
    product = _product(world, base, p["product"])
    category = base.get(world.categories, product.category_id)
    assert category is not None
    return Built(
        intent=f"Which category is {product.name} listed in?",
        start="/",
        eval=string_match(exact=category.name),
        plan=[
            *_open_product(product.name),
            exit_with(category.name, f"The product page says its category is {category.name}."),
        ],
    )


def _categories(world: World, base: Tenant) -> list[dict[str, str]]:
    return [{"category": c.name} for c in base.all(world.categories)]


def _category(world: World, base: Tenant, name: str) -> tuple[int, str]:
    found = [c for c in base.all(world.categories) if c.name == name]
    if not found:
        raise ValueError(f"no category {name!r}")
    return found[0].id, found[0].slug


def _open_category(world: World, base: Tenant, p: dict[str, str]) -> Built:
    _, slug = _category(world, base, p["category"])
    return Built(
        intent=f"Open the {p['category']} category.",
        start="/",
        eval=url_match(SITE, f"/category/{slug}"),
        plan=[
            link(p["category"], f"Click the {p['category']} category."),
            exit_with("", "The category page is open."),
        ],
    )


def _sorted_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    return [
        {"category": c.name, "sort": text}
        for c in base.all(world.categories)
        for key, text in SORTS.items()
        if key != "name"
    ]


def _sorted_category(world: World, base: Tenant, p: dict[str, str]) -> Built:
    _, slug = _category(world, base, p["category"])
    key = next(k for k, text in SORTS.items() if text == p["sort"])
    return Built(
        intent=f"Show the {p['category']} category sorted by {p['sort']}.",
        start="/",
        eval=url_match(SITE, f"/category/{slug}?sort={key}"),
        plan=[
            link(p["category"], f"Open the {p['category']} category."),
            select("sort", p["sort"], f"Sort by {p['sort']}."),
            button("Apply", "Apply the sort order."),
            exit_with("", "The category is shown in the requested order."),
        ],
    )


def _extreme_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    found = []
    for c in base.all(world.categories):
        products = category_products(base, world, c.id, "price_asc")
        prices = [p.price_cents for p in products]
        if prices.count(prices[0]) == 1:
            found.append({"category": c.name, "extreme": "cheapest"})
        if prices.count(prices[-1]) == 1:
            found.append({"category": c.name, "extreme": "most expensive"})
    return found


def _extreme(world: World, base: Tenant, p: dict[str, str]) -> Built:
    cid, _ = _category(world, base, p["category"])
    sort = "price_asc" if p["extreme"] == "cheapest" else "price_desc"
    top = category_products(base, world, cid, sort)[0]
    return Built(
        intent=f"What is the {p['extreme']} product in the {p['category']} category?",
        start="/",
        eval=string_match(exact=top.name),
        plan=[
            link(p["category"], f"Open the {p['category']} category."),
            select("sort", SORTS[sort], f"Sort by {SORTS[sort]} to find the {p['extreme']}."),
            button("Apply", "Apply the sort order."),
            exit_with(top.name, f"The first product is {top.name}."),
        ],
    )


def _search_terms(world: World, base: Tenant) -> list[dict[str, str]]:
    terms = [*words.BRANDS, *words.ADJECTIVES]
    terms += [noun for _, _, nouns in words.NOUNS_BY_CATEGORY for noun in nouns]
    return [{"term": t} for t in terms if 0 < len(search_products(base, world, t)) <= 99]


def _search_count(world: World, base: Tenant, p: dict[str, str]) -> Built:
    count = str(len(search_products(base, world, p["term"])))
    return Built(
        intent=f"How many products does a search for '{p['term']}' find?",
        start="/",
        eval=string_match(exact=count),
        plan=[
            search("q", p["term"], f"Search the store for {p['term']}."),
            exit_with(count, f"The search found {count} items."),
        ],
    )


# --------------------------------------------------------------------------- account


def _emma_orders(world: World, base: Tenant) -> list[dict[str, str]]:
    emma = customer_by_email(base, world, ACCOUNTS[SITE].username)
    assert emma is not None
    return [{"order": str(o.id)} for o in customer_orders(base, world, emma.id)]


def _find_order(world: World, base: Tenant, order_id: str) -> tuple[int, Order]:
    emma = customer_by_email(base, world, ACCOUNTS[SITE].username)
    assert emma is not None
    orders = customer_orders(base, world, emma.id)
    for index, order in enumerate(orders):
        if str(order.id) == order_id:
            return index, order
    raise ValueError(f"no order {order_id} of the default customer")


def _to_orders(index: int) -> list[OracleStep]:
    return [
        link("My Account", "Open my account."),
        link("My Orders", "Open the list of my orders."),
        *next_pages(index, ORDERS_PER_PAGE, "The order"),
    ]


def _order_status(world: World, base: Tenant, p: dict[str, str]) -> Built:
    index, order = _find_order(world, base, p["order"])
    status = order.status
    return Built(
        intent=f"What is the status of my order {p['order']}?",
        start="/",
        eval=string_match(exact=status),
        plan=[*_to_orders(index), exit_with(status, f"Order {p['order']} has status {status}.")],
        require_login=True,
    )


def _order_shipping(world: World, base: Tenant, p: dict[str, str]) -> Built:
    index, order = _find_order(world, base, p["order"])
    method = order.shipping
    return Built(
        intent=f"Which shipping method did I choose for my order {p['order']}?",
        start="/",
        eval=string_match(exact=method),
        plan=[
            *_to_orders(index),
            link(f"Order {p['order']}", f"Open order {p['order']}."),
            exit_with(method, f"The order was shipped with {method}."),
        ],
        require_login=True,
    )


# --------------------------------------------------------------------------- state changes


def _qty_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    rng = random.Random(f"{world.seed}:shop-qty")
    return [
        {"product": p["product"], "qty": str(rng.randrange(2, 6))} for p in _enabled(world, base)
    ]


def _add_steps(name: str, qty: str) -> list[OracleStep]:
    return [
        *_open_product(name),
        type_into("qty", qty, f"Set the quantity to {qty}."),
        button("Add to Cart", f"Add {name} to the cart."),
    ]


def _add_to_cart(world: World, base: Tenant, p: dict[str, str]) -> Built:
    product = _product(world, base, p["product"])
    locator = f"document.querySelector('tr[data-product=\"{product.id}\"] .qty')?.outerText ?? ''"
    return Built(
        intent=f"Add {p['qty']} of {product.name} to my cart.",
        start="/",
        eval=program_html(SITE, [("/cart", locator, {"exact_match": p["qty"]})]),
        plan=[*_add_steps(product.name, p["qty"]), exit_with("", "The items are in the cart.")],
        require_login=True,
        require_reset=True,
    )


_FIRST_ORDER_ROW = "document.querySelector('#orders tbody tr')?.outerText ?? ''"


def _order_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    rng = random.Random(f"{world.seed}:shop-order")
    products = _enabled(world, base)
    return [
        {**p, "qty": str(rng.randrange(1, 4)), "shipping": rng.choice(tuple(SHIPPING))}
        for p in products
    ]


def _checkout_steps(shipping: str) -> list[OracleStep]:
    return [
        link("My Cart", "Open the shopping cart."),
        link("Proceed to Checkout", "Go to the checkout."),
        select("shipping", shipping, f"Choose {shipping} shipping."),
        button("Place Order", "Place the order."),
    ]


def _place_order(world: World, base: Tenant, p: dict[str, str]) -> Built:
    product = _product(world, base, p["product"])
    total = money(product.price_cents * int(p["qty"]) + SHIPPING[p["shipping"]])
    return Built(
        intent=f"Buy {p['qty']} of {product.name} using the {p['shipping']} shipping method.",
        start="/",
        eval=program_html(
            SITE,
            [
                (
                    "/account/orders",
                    _FIRST_ORDER_ROW,
                    {"must_include": [f"{product.name} (x{p['qty']})", total]},
                )
            ],
        ),
        plan=[
            *_add_steps(product.name, p["qty"]),
            *_checkout_steps(p["shipping"]),
            exit_with("", "The order is placed."),
        ],
        require_login=True,
        require_reset=True,
    )


def _pair_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    rng = random.Random(f"{world.seed}:shop-pair")
    products = [p["product"] for p in _enabled(world, base)]
    found = []
    for first in products:
        second = rng.choice(products)
        if second != first:
            found.append(
                {
                    "product1": first,
                    "qty1": str(rng.randrange(1, 4)),
                    "product2": second,
                    "qty2": str(rng.randrange(1, 4)),
                    "shipping": rng.choice(tuple(SHIPPING)),
                }
            )
    return found


def _order_two(world: World, base: Tenant, p: dict[str, str]) -> Built:
    one, two = _product(world, base, p["product1"]), _product(world, base, p["product2"])
    cents = one.price_cents * int(p["qty1"]) + two.price_cents * int(p["qty2"])
    total = money(cents + SHIPPING[p["shipping"]])
    return Built(
        intent=f"Buy {p['qty1']} of {one.name} and {p['qty2']} of {two.name} "
        f"using the {p['shipping']} shipping method.",
        start="/",
        eval=program_html(
            SITE,
            [
                (
                    "/account/orders",
                    _FIRST_ORDER_ROW,
                    {
                        "must_include": [
                            f"{one.name} (x{p['qty1']})",
                            f"{two.name} (x{p['qty2']})",
                            total,
                        ]
                    },
                )
            ],
        ),
        plan=[
            *_add_steps(one.name, p["qty1"]),
            *_add_steps(two.name, p["qty2"]),
            *_checkout_steps(p["shipping"]),
            exit_with("", "The order with both products is placed."),
        ],
        require_login=True,
        require_reset=True,
    )


def _review_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    rng = random.Random(f"{world.seed}:shop-review")
    return [
        {
            "product": p["product"],
            "stars": str(rng.randrange(1, 6)),
            "title": rng.choice(words.REVIEW_TITLES),
            "text": f"{rng.choice(words.COMMENT_OPENERS)} "
            f"Bought it in {rng.choice(words.CITIES)[0]}.",
        }
        for p in _enabled(world, base)
    ]


def _write_review(world: World, base: Tenant, p: dict[str, str]) -> Built:
    product = _product(world, base, p["product"])
    locator = "document.querySelector('#reviews li')?.outerText ?? ''"
    stars = f"{p['stars']} star" + ("" if p["stars"] == "1" else "s")
    return Built(
        intent=f"Write a {p['stars']}-star review of {product.name} with the summary "
        f"'{p['title']}' and the text '{p['text']}'.",
        start="/",
        eval=program_html(
            SITE,
            [
                (
                    f"/product/{product.id}",
                    locator,
                    {"must_include": [p["title"], p["text"], stars]},
                )
            ],
        ),
        plan=[
            *_open_product(product.name),
            select("rating", stars, f"Rate it {stars}."),
            type_into("title", p["title"], "Enter the summary."),
            type_into("text", p["text"], "Enter the review text.", tag="textarea"),
            button("Submit Review", "Submit the review."),
            exit_with("", "The review is submitted."),
        ],
        require_login=True,
        require_reset=True,
    )


def _name_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    return [{"last_name": name} for name in words.LAST_NAMES if name != "Lopez"]


def _edit_name(world: World, base: Tenant, p: dict[str, str]) -> Built:
    locator = "document.querySelector('#account-info').outerText"
    return Built(
        intent=f"Change the last name in my account to {p['last_name']}.",
        start="/",
        eval=program_html(
            SITE, [("/account", locator, {"must_include": [f"Emma {p['last_name']}"]})]
        ),
        plan=[
            link("My Account", "Open my account."),
            link("Edit Account Information", "Open the account information form."),
            type_into("last_name", p["last_name"], f"Enter the last name {p['last_name']}."),
            button("Save", "Save the account information."),
            exit_with("", "The last name is changed."),
        ],
        require_login=True,
        require_reset=True,
    )


TEMPLATES = [
    Template(101, SITE, "product_price", "What is the price of {product}?", _enabled, _price),
    Template(
        102, SITE, "product_sku", "What is the SKU of {product}?", _enabled, _sku, train_cap=50
    ),
    Template(
        103, SITE, "open_category", "Open the {category} category.", _categories, _open_category
    ),
    Template(
        104,
        SITE,
        "sorted_category",
        "Show the {category} category sorted by {sort}.",
        _sorted_candidates,
        _sorted_category,
    ),
    Template(
        105, SITE, "review_count", "How many reviews does {product} have?", _enabled, _review_count
    ),
    Template(
        106,
        SITE,
        "category_extreme",
        "What is the {extreme} product in the {category} category?",
        _extreme_candidates,
        _extreme,
    ),
    Template(
        107,
        SITE,
        "order_status",
        "What is the status of my order {order}?",
        _emma_orders,
        _order_status,
    ),
    Template(
        108,
        SITE,
        "order_shipping",
        "Which shipping method did I choose for my order {order}?",
        _emma_orders,
        _order_shipping,
    ),
    Template(
        109,
        SITE,
        "add_to_cart",
        "Add {qty} of {product} to my cart.",
        _qty_candidates,
        _add_to_cart,
    ),
    Template(
        110,
        SITE,
        "place_order",
        "Buy {qty} of {product} using the {shipping} shipping method.",
        _order_candidates,
        _place_order,
    ),
    Template(
        111,
        SITE,
        "order_two",
        "Buy {qty1} of {product1} and {qty2} of {product2} using the {shipping} shipping method.",
        _pair_candidates,
        _order_two,
    ),
    Template(
        112,
        SITE,
        "write_review",
        "Write a {stars}-star review of {product} with the summary '{title}' "
        "and the text '{text}'.",
        _review_candidates,
        _write_review,
    ),
    Template(
        113,
        SITE,
        "edit_last_name",
        "Change the last name in my account to {last_name}.",
        _name_candidates,
        _edit_name,
        ood=True,
        train_cap=12,
    ),
    Template(
        114,
        SITE,
        "search_count",
        "How many products does a search for '{term}' find?",
        _search_terms,
        _search_count,
        ood=True,
        train_cap=12,
    ),
    Template(
        115,
        SITE,
        "product_category",
        "Which category is {product} listed in?",
        _enabled,
        _product_category,
    ),
]
