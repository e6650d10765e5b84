"""The shop's admin (SHOPPING_ADMIN): orders grid with filters, products, customers, reports.

It works on the shop's own tables, so an edit here (a price, a status) shows in the shop
for the same tenant. Every page needs the admin login.
"""

from __future__ import annotations

import msgspec
from starlette.responses import Response

from sites.builtin.data import ORDER_STATUSES, World
from sites.builtin.records import Customer, Order, Product
from sites.builtin.tenants import Tenant, TenantStore
from sites.builtin.web import Counters, Redirect, Req, Site, paginate

__all__ = [
    "ADMIN_PER_PAGE",
    "ORDER_SORTS",
    "PERIODS",
    "bestseller_counts",
    "bestsellers",
    "build_admin",
    "filter_orders",
    "search_admin_products",
    "search_customers",
]

ADMIN_PER_PAGE = 15
# Sort key -> option text of the orders grid's "Sort By" select.
ORDER_SORTS = {
    "date_desc": "Purchase Date: Newest First",
    "date_asc": "Purchase Date: Oldest First",
    "total_desc": "Grand Total: Highest First",
    "total_asc": "Grand Total: Lowest First",
}
PERIODS = ("Year", "Month")
_MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)  # fmt: skip


def filter_orders(
    tenant: Tenant,
    world: World,
    *,
    query: str = "",
    status: str = "",
    date_from: str = "",
    date_to: str = "",
    sort: str = "date_desc",
) -> list[Order]:
    """The orders grid: `query` matches the order number or the customer's name/email."""
    customers = {c.id: c for c in tenant.all(world.customers)}
    needle = query.lower().strip()
    found = []
    for order in tenant.all(world.orders):
        customer = customers.get(order.customer_id)
        if needle and not (
            needle == str(order.id)
            or (customer and needle in f"{customer.name} {customer.email}".lower())
        ):
            continue
        if status and order.status != status:
            continue
        if date_from and order.date < date_from:
            continue
        if date_to and order.date > date_to:
            continue
        found.append(order)
    if sort == "date_asc":
        return sorted(found, key=lambda o: (o.date, o.id))
    if sort == "total_desc":
        return sorted(found, key=lambda o: (-o.total_cents, o.id))
    if sort == "total_asc":
        return sorted(found, key=lambda o: (o.total_cents, o.id))
    return sorted(found, key=lambda o: (o.date, o.id), reverse=True)


def search_admin_products(tenant: Tenant, world: World, query: str) -> list[Product]:
    """Products (disabled ones too) whose name or SKU contains `query`, by id."""
    needle = query.lower().strip()
    return [
        p
        for p in tenant.all(world.products)
        if not needle or needle in p.name.lower() or needle == p.sku.lower()
    ]


def search_customers(tenant: Tenant, world: World, query: str) -> list[Customer]:
    needle = query.lower().strip()
    return [
        c
        for c in tenant.all(world.customers)
        if not needle or needle in f"{c.name} {c.email}".lower()
    ]


def bestseller_counts(
    tenant: Tenant, world: World, year: str, period: str
) -> dict[str, dict[str, int]]:
    """{period label: {product name: quantity ordered}}; canceled orders do not count.

    Labels: the year ("2023") for period "Year", "March 2023" for period "Month".
    """
    by_period: dict[str, dict[str, int]] = {}
    for order in tenant.all(world.orders):
        if order.status == "Canceled" or not order.date.startswith(year):
            continue
        label = year if period == "Year" else f"{_MONTHS[int(order.date[5:7]) - 1]} {year}"
        counts = by_period.setdefault(label, {})
        for item in order.items:
            counts[item.name] = counts.get(item.name, 0) + item.qty
    return by_period


def bestsellers(tenant: Tenant, world: World, year: str, period: str) -> list[tuple[str, str, int]]:
    """(period label, product name, quantity ordered) rows of the bestsellers report.

    "Year": the five best-selling products of the year; "Month": the best-selling product
    of each month that had orders. Ties: by name.
    """
    by_period = bestseller_counts(tenant, world, year, period)
    rows: list[tuple[str, str, int]] = []
    keep = 5 if period == "Year" else 1
    for label in sorted(by_period, key=_month_index):
        ranked = sorted(by_period[label].items(), key=lambda kv: (-kv[1], kv[0]))
        rows.extend((label, name, qty) for name, qty in ranked[:keep])
    return rows


def _month_index(label: str) -> int:
    name = label.split(" ", 1)[0]
    return _MONTHS.index(name) if name in _MONTHS else -1


def build_admin(world: World, tenants: TenantStore, counters: Counters) -> Site:
    """The admin's app."""
    site = Site(
        name="shopping_admin",
        title="Magento Admin",
        nav=[
            ("Orders", "/orders"),
            ("Products", "/products"),
            ("Customers", "/customers"),
            ("Reports", "/reports"),
        ],
        world=world,
        tenants=tenants,
        counters=counters,
    )

    async def dashboard(req: Req) -> Response:
        req.require_login()
        latest = filter_orders(req.tenant, world)[:5]
        customers = {c.id: c for c in req.tenant.all(world.customers)}
        return req.render("admin/dashboard.html", latest=latest, customers=customers)

    async def orders(req: Req) -> Response:
        req.require_login()
        status = req.arg("status")
        sort = req.arg("sort", "date_desc")
        found = filter_orders(
            req.tenant,
            world,
            query=req.arg("q"),
            status=status if status in ORDER_STATUSES else "",
            date_from=req.arg("date_from"),
            date_to=req.arg("date_to"),
            sort=sort if sort in ORDER_SORTS else "date_desc",
        )
        customers = {c.id: c for c in req.tenant.all(world.customers)}
        return req.render(
            "admin/orders.html",
            page=paginate(found, req, ADMIN_PER_PAGE),
            customers=customers,
            statuses=ORDER_STATUSES,
            sorts=ORDER_SORTS,
            args={k: req.arg(k) for k in ("q", "status", "date_from", "date_to", "sort")},
        )

    async def order(req: Req) -> Response:
        req.require_login()
        found = req.tenant.get(world.orders, req.path_int("order_id"))
        if found is None:
            return req.not_found("This order no longer exists.")
        customer = req.tenant.get(world.customers, found.customer_id)
        return req.render(
            "admin/order.html", order=found, customer=customer, statuses=ORDER_STATUSES
        )

    async def order_status(req: Req) -> Response:
        req.require_login()
        found = req.tenant.get(world.orders, req.path_int("order_id"))
        if found is None:
            return req.not_found("This order no longer exists.")
        status = (await req.form()).get("status", "")
        if status not in ORDER_STATUSES:
            req.flash("Please choose a status.")
        else:
            req.tenant.put(world.orders, msgspec.structs.replace(found, status=status))
            req.flash(f"You changed the order status to {status}.")
        raise Redirect(f"/orders/{found.id}")

    async def products(req: Req) -> Response:
        req.require_login()
        found = search_admin_products(req.tenant, world, req.arg("q"))
        return req.render(
            "admin/products.html", page=paginate(found, req, ADMIN_PER_PAGE), query=req.arg("q")
        )

    async def product_edit(req: Req) -> Response:
        req.require_login()
        found = req.tenant.get(world.products, req.path_int("product_id"))
        if found is None:
            return req.not_found("This product no longer exists.")
        return req.render("admin/product_edit.html", product=found, error="")

    async def product_save(req: Req) -> Response:
        req.require_login()
        found = req.tenant.get(world.products, req.path_int("product_id"))
        if found is None:
            return req.not_found("This product no longer exists.")
        form = await req.form()
        try:
            price = round(float(form.get("price", "").lstrip("$").replace(",", "")) * 100)
            quantity = int(form.get("quantity", ""))
        except ValueError:
            price, quantity = -1, -1
        name = form.get("name", "")
        if price < 0 or quantity < 0 or not name or form.get("status") not in ("1", "0"):
            return req.render(
                "admin/product_edit.html",
                status=400,
                product=found,
                error="Please enter a name, a price and a quantity of zero or more.",
            )
        req.tenant.put(
            world.products,
            msgspec.structs.replace(
                found,
                name=name,
                price_cents=price,
                quantity=quantity,
                enabled=form["status"] == "1",
            ),
        )
        req.flash("You saved the product.")
        raise Redirect(f"/products/{found.id}/edit")

    async def customers(req: Req) -> Response:
        req.require_login()
        found = search_customers(req.tenant, world, req.arg("q"))
        return req.render(
            "admin/customers.html", page=paginate(found, req, ADMIN_PER_PAGE), query=req.arg("q")
        )

    async def customer(req: Req) -> Response:
        req.require_login()
        found = req.tenant.get(world.customers, req.path_int("customer_id"))
        if found is None:
            return req.not_found("This customer no longer exists.")
        history = sorted(
            req.tenant.where(world.orders, "customer_id", found.id),
            key=lambda o: (o.date, o.id),
            reverse=True,
        )
        return req.render("admin/customer.html", customer=found, orders=history)

    async def reports(req: Req) -> Response:
        req.require_login()
        return req.render("admin/reports.html")

    async def report_bestsellers(req: Req) -> Response:
        req.require_login()
        years = sorted({o.date[:4] for o in req.tenant.all(world.orders)})
        year = req.arg("year")
        period = req.arg("period", "Year")
        rows = bestsellers(req.tenant, world, year, period) if year in years else []
        return req.render(
            "admin/bestsellers.html",
            years=years,
            periods=PERIODS,
            year=year,
            period=period,
            rows=rows,
            shown=year in years,
        )

    site.add("/", dashboard)
    site.add("/orders", orders)
    site.add("/orders/{order_id:int}", order)
    site.add("/orders/{order_id:int}/status", order_status, methods=["POST"])
    site.add("/products", products)
    site.add("/products/{product_id:int}/edit", product_edit)
    site.add("/products/{product_id:int}/edit", product_save, methods=["POST"])
    site.add("/customers", customers)
    site.add("/customers/{customer_id:int}", customer)
    site.add("/reports", reports)
    site.add("/reports/bestsellers", report_bestsellers)
    return site
