"""Task templates of the shop admin (SHOPPING_ADMIN): ids 201-299. All need the login."""

from __future__ import annotations

import calendar
import random

from runtime.base.messages import OracleStep
from sites.builtin.admin import (
    bestseller_counts,
    bestsellers,
    filter_orders,
    search_admin_products,
    search_customers,
)
from sites.builtin.data import ORDER_STATUSES, World
from sites.builtin.records import Customer, Order, Product, money
from sites.builtin.template_kit import (
    Built,
    Template,
    button,
    exit_with,
    link,
    program_html,
    search,
    select,
    string_match,
    type_into,
)
from sites.builtin.tenants import Tenant

__all__ = ["TEMPLATES"]

SITE = "shopping_admin"


def _order(world: World, base: Tenant, order_id: str) -> Order:
    found = base.get(world.orders, int(order_id))
    if found is None:
        raise ValueError(f"no order {order_id}")
    return found


def _orders(world: World, base: Tenant) -> list[dict[str, str]]:
    return [{"order": str(o.id)} for o in base.all(world.orders)]


def _find_order_steps(order_id: str) -> list[OracleStep]:
    return [
        link("Orders", "Open the orders grid."),
        search("q", order_id, f"Search the grid for order {order_id}."),
    ]


def _order_customer(world: World, base: Tenant, p: dict[str, str]) -> Built:
    order = _order(world, base, p["order"])
    customer = base.get(world.customers, order.customer_id)
    assert customer is not None
    return Built(
        intent=f"Who is the customer of order {p['order']}?",
        start="/",
        eval=string_match(exact=customer.name),
        plan=[
            *_find_order_steps(p["order"]),
            exit_with(customer.name, f"The bill-to name of order {p['order']} is {customer.name}."),
        ],
        require_login=True,
    )


def _order_date(world: World, base: Tenant, p: dict[str, str]) -> Built:
    order = _order(world, base, p["order"])
    return Built(
        intent=f"On which date was order {p['order']} placed?",
        start="/",
        eval=string_match(must_include=[order.date]),
        plan=[
            *_find_order_steps(p["order"]),
            exit_with(order.date, f"Order {p['order']} was placed on {order.date}."),
        ],
        require_login=True,
    )


def _status_month_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    years = sorted({o.date[:4] for o in base.all(world.orders)})
    return [
        {"status": status, "start": f"{year}-{month:02d}-01", "end": _month_end(year, month)}
        for status in ORDER_STATUSES
        for year in years
        for month in range(1, 13)
    ]


def _month_end(year: str, month: int) -> str:
    return f"{year}-{month:02d}-{calendar.monthrange(int(year), month)[1]:02d}"


def _status_count(world: World, base: Tenant, p: dict[str, str]) -> Built:
    count = str(
        len(filter_orders(base, world, status=p["status"], date_from=p["start"], date_to=p["end"]))
    )
    return Built(
        intent=f"How many orders with status {p['status']} were placed between "
        f"{p['start']} and {p['end']}?",
        start="/",
        eval=string_match(exact=count),
        plan=[
            link("Orders", "Open the orders grid."),
            select("status", p["status"], f"Filter by status {p['status']}."),
            type_into("date_from", p["start"], "Enter the first purchase date."),
            type_into("date_to", p["end"], "Enter the last purchase date."),
            button("Apply Filters", "Apply the filters."),
            exit_with(count, f"The grid reports {count} records."),
        ],
        require_login=True,
    )


def _product(world: World, base: Tenant, name: str) -> Product:
    found = [p for p in base.all(world.products) if p.name == name]
    if not found:
        raise ValueError(f"no product named {name!r}")
    return found[0]


def _searchable_products(world: World, base: Tenant) -> list[dict[str, str]]:
    """Products whose name search fits on the first grid page."""
    return [
        {"product": p.name}
        for p in base.all(world.products)
        if len(search_admin_products(base, world, p.name)) <= 15
    ]


def _open_product_steps(name: str) -> list[OracleStep]:
    return [
        link("Products", "Open the products grid."),
        search("q", name, f"Search the grid for {name}."),
        link(name, f"Open {name} for editing."),
    ]


def _product_quantity(world: World, base: Tenant, p: dict[str, str]) -> Built:
    product = _product(world, base, p["product"])
    qty = str(product.quantity)
    return Built(
        intent=f"What is the stock quantity of {product.name}?",
        start="/",
        eval=string_match(exact=qty),
        plan=[
            link("Products", "Open the products grid."),
            search("q", product.name, f"Search the grid for {product.name}."),
            exit_with(qty, f"The grid shows a quantity of {qty}."),
        ],
        require_login=True,
    )


def _customers(world: World, base: Tenant) -> list[dict[str, str]]:
    return [
        {"customer": c.name}
        for c in base.all(world.customers)
        if len(search_customers(base, world, c.name)) == 1
    ]


def _customer(world: World, base: Tenant, name: str) -> Customer:
    found = [c for c in base.all(world.customers) if c.name == name]
    if not found:
        raise ValueError(f"no customer named {name!r}")
    return found[0]


def _customer_email(world: World, base: Tenant, p: dict[str, str]) -> Built:
    customer = _customer(world, base, p["customer"])
    return Built(
        intent=f"What is the email address of the customer {customer.name}?",
        start="/",
        eval=string_match(exact=customer.email),
        plan=[
            link("Customers", "Open the customers grid."),
            search("q", customer.name, f"Search for {customer.name}."),
            exit_with(customer.email, f"The email of {customer.name} is {customer.email}."),
        ],
        require_login=True,
    )


def _customer_orders(world: World, base: Tenant, p: dict[str, str]) -> Built:
    customer = _customer(world, base, p["customer"])
    count = str(len(base.where(world.orders, "customer_id", customer.id)))
    return Built(
        intent=f"How many orders has the customer {customer.name} placed?",
        start="/",
        eval=string_match(exact=count),
        plan=[
            link("Customers", "Open the customers grid."),
            search("q", customer.name, f"Search for {customer.name}."),
            link(customer.name, f"Open the customer page of {customer.name}."),
            exit_with(count, f"The customer has {count} orders."),
        ],
        require_login=True,
    )


def _bestseller_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    found = []
    for year in sorted({o.date[:4] for o in base.all(world.orders)}):
        for period in ("Year", "Month"):
            for label, counts in bestseller_counts(base, world, year, period).items():
                ranked = sorted(counts.values(), reverse=True)
                if len(ranked) == 1 or ranked[0] > ranked[1]:
                    found.append({"period": label})
    return found


def _bestseller(world: World, base: Tenant, p: dict[str, str]) -> Built:
    label = p["period"]
    year, period = label[-4:], "Year" if len(label) == 4 else "Month"
    top = next(r for r in bestsellers(base, world, year, period) if r[0] == label)[1]
    steps = [
        link("Reports", "Open the reports."),
        link("Bestsellers", "Open the bestsellers report."),
        select("year", year, f"Choose the year {year}."),
    ]
    if period == "Month":
        steps.append(select("period", "Month", "Show the report by month."))
    return Built(
        intent=f"What was the best-selling product in {label}?",
        start="/",
        eval=string_match(exact=top),
        plan=[
            *steps,
            button("Show Report", "Show the report."),
            exit_with(top, f"The best-selling product in {label} was {top}."),
        ],
        require_login=True,
    )


def _price_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    rng = random.Random(f"{world.seed}:admin-price")
    return [
        {**p, "price": f"{rng.randrange(5, 300)}.{rng.choice((0, 49, 95, 99)):02d}"}
        for p in _searchable_products(world, base)
    ]


def _update_price(world: World, base: Tenant, p: dict[str, str]) -> Built:
    product = _product(world, base, p["product"])
    shown = money(round(float(p["price"]) * 100))
    return Built(
        intent=f"Change the price of {product.name} to ${p['price']}.",
        start="/",
        eval=program_html(
            SITE,
            [
                (
                    f"/products/{product.id}/edit",
                    "document.querySelector('#price').outerText",
                    {"exact_match": shown},
                )
            ],
        ),
        plan=[
            *_open_product_steps(product.name),
            type_into("price", p["price"], f"Enter the new price {p['price']}."),
            button("Save Product", "Save the product."),
            exit_with("", "The price is changed."),
        ],
        require_login=True,
        require_reset=True,
    )


def _disable_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    return [
        p for p in _searchable_products(world, base) if _product(world, base, p["product"]).enabled
    ]


def _disable(world: World, base: Tenant, p: dict[str, str]) -> Built:
    product = _product(world, base, p["product"])
    return Built(
        intent=f"Disable the product {product.name}.",
        start="/",
        eval=program_html(
            SITE,
            [
                (
                    f"/products/{product.id}/edit",
                    "document.querySelector('#product-status').outerText",
                    {"exact_match": "Disabled"},
                )
            ],
        ),
        plan=[
            *_open_product_steps(product.name),
            select("status", "Disabled", "Set the product to Disabled."),
            button("Save Product", "Save the product."),
            exit_with("", "The product is disabled."),
        ],
        require_login=True,
        require_reset=True,
    )


def _stock_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    rng = random.Random(f"{world.seed}:admin-stock")
    return [{**p, "qty": str(rng.randrange(0, 500))} for p in _searchable_products(world, base)]


def _update_stock(world: World, base: Tenant, p: dict[str, str]) -> Built:
    product = _product(world, base, p["product"])
    return Built(
        intent=f"Set the stock quantity of {product.name} to {p['qty']}.",
        start="/",
        eval=program_html(
            SITE,
            [
                (
                    f"/products?q={product.sku}",
                    "document.querySelector('#products-grid td.qty')?.outerText ?? ''",
                    {"exact_match": p["qty"]},
                )
            ],
        ),
        plan=[
            *_open_product_steps(product.name),
            type_into("quantity", p["qty"], f"Enter the quantity {p['qty']}."),
            button("Save Product", "Save the product."),
            exit_with("", "The stock quantity is changed."),
        ],
        require_login=True,
        require_reset=True,
    )


def _status_change_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    rng = random.Random(f"{world.seed}:admin-status")
    found = []
    for order in base.all(world.orders):
        status = rng.choice([s for s in ORDER_STATUSES if s != order.status])
        found.append({"order": str(order.id), "status": status})
    return found


def _change_status(world: World, base: Tenant, p: dict[str, str]) -> Built:
    _order(world, base, p["order"])
    return Built(
        intent=f"Change the status of order {p['order']} to {p['status']}.",
        start="/",
        eval=program_html(
            SITE,
            [
                (
                    f"/orders/{p['order']}",
                    "document.querySelector('#order-status').outerText",
                    {"exact_match": p["status"]},
                )
            ],
        ),
        plan=[
            *_find_order_steps(p["order"]),
            link(f"Order {p['order']}", f"Open order {p['order']}."),
            select("status", p["status"], f"Choose the status {p['status']}."),
            button("Update Status", "Save the new status."),
            exit_with("", f"Order {p['order']} now has status {p['status']}."),
        ],
        require_login=True,
        require_reset=True,
    )


TEMPLATES = [
    Template(
        201,
        SITE,
        "order_customer",
        "Who is the customer of order {order}?",
        _orders,
        _order_customer,
    ),
    Template(
        202,
        SITE,
        "status_count",
        "How many orders with status {status} were placed between {start} and {end}?",
        _status_month_candidates,
        _status_count,
    ),
    Template(
        203,
        SITE,
        "product_quantity",
        "What is the stock quantity of {product}?",
        _searchable_products,
        _product_quantity,
        train_cap=40,
    ),
    Template(
        204,
        SITE,
        "customer_email",
        "What is the email address of the customer {customer}?",
        _customers,
        _customer_email,
        train_cap=40,
    ),
    Template(
        205,
        SITE,
        "bestseller",
        "What was the best-selling product in {period}?",
        _bestseller_candidates,
        _bestseller,
    ),
    Template(
        206,
        SITE,
        "update_price",
        "Change the price of {product} to ${price}.",
        _price_candidates,
        _update_price,
    ),
    Template(
        207,
        SITE,
        "change_order_status",
        "Change the status of order {order} to {status}.",
        _status_change_candidates,
        _change_status,
    ),
    Template(
        208,
        SITE,
        "disable_product",
        "Disable the product {product}.",
        _disable_candidates,
        _disable,
    ),
    Template(
        209,
        SITE,
        "customer_order_count",
        "How many orders has the customer {customer} placed?",
        _customers,
        _customer_orders,
        ood=True,
        train_cap=12,
    ),
    Template(
        210,
        SITE,
        "order_date",
        "On which date was order {order} placed?",
        _orders,
        _order_date,
        train_cap=40,
    ),
    Template(
        211,
        SITE,
        "update_stock",
        "Set the stock quantity of {product} to {qty}.",
        _stock_candidates,
        _update_stock,
        ood=True,
        train_cap=12,
    ),
]
