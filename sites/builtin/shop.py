"""The shop (SHOPPING, like OneStopShop): categories, search, products, cart, checkout, account.

Queries are plain functions of (tenant, world): the pages use them and so does the task
suite, which computes its reference answers on a fresh tenant (the seeded data).
"""

from __future__ import annotations

import msgspec
from starlette.responses import Response

from sites.builtin.data import SHIPPING, TODAY, World
from sites.builtin.records import CartLine, Customer, Order, OrderItem, Product, Review
from sites.builtin.tenants import Tenant, TenantStore
from sites.builtin.web import Counters, Redirect, Req, Site, paginate

__all__ = [
    "ORDERS_PER_PAGE",
    "PRODUCTS_PER_PAGE",
    "SORTS",
    "build_shop",
    "category_products",
    "customer_by_email",
    "customer_orders",
    "rating",
    "search_products",
]

PRODUCTS_PER_PAGE = 12
ORDERS_PER_PAGE = 10
# Sort key -> the option text of the category page's "Sort By" select.
SORTS = {
    "name": "Name",
    "price_asc": "Price: Low to High",
    "price_desc": "Price: High to Low",
    "rating": "Rating",
}


def rating(tenant: Tenant, world: World, product_id: int) -> tuple[float, int]:
    """(average rating rounded to one decimal, number of reviews); (0.0, 0) without any."""
    reviews = tenant.where(world.reviews, "product_id", product_id)
    if not reviews:
        return 0.0, 0
    return round(sum(r.rating for r in reviews) / len(reviews), 1), len(reviews)


def _sorted(tenant: Tenant, world: World, products: list[Product], sort: str) -> list[Product]:
    if sort == "price_asc":
        return sorted(products, key=lambda p: (p.price_cents, p.name))
    if sort == "price_desc":
        return sorted(products, key=lambda p: (-p.price_cents, p.name))
    if sort == "rating":
        return sorted(products, key=lambda p: (-rating(tenant, world, p.id)[0], p.name))
    return sorted(products, key=lambda p: p.name)


def search_products(tenant: Tenant, world: World, query: str, sort: str = "name") -> list[Product]:
    """Enabled products whose name contains every word of `query` (any case)."""
    terms = query.lower().split()
    if not terms:
        return []
    found = [
        p
        for p in tenant.all(world.products)
        if p.enabled and all(term in p.name.lower() for term in terms)
    ]
    return _sorted(tenant, world, found, sort)


def category_products(
    tenant: Tenant, world: World, category_id: int, sort: str = "name"
) -> list[Product]:
    products = [p for p in tenant.where(world.products, "category_id", category_id) if p.enabled]
    return _sorted(tenant, world, products, sort)


def customer_by_email(tenant: Tenant, world: World, email: str) -> Customer | None:
    found = tenant.where(world.customers, "email", email)
    return found[0] if found else None


def customer_orders(tenant: Tenant, world: World, customer_id: int) -> list[Order]:
    """A customer's orders, newest first."""
    orders = tenant.where(world.orders, "customer_id", customer_id)
    return sorted(orders, key=lambda o: (o.date, o.id), reverse=True)


def _cart(tenant: Tenant, world: World, customer_id: int) -> list[tuple[CartLine, Product]]:
    lines = []
    for line in tenant.where(world.cart, "customer_id", customer_id):
        product = tenant.get(world.products, line.product_id)
        if product is not None:
            lines.append((line, product))
    return lines


def build_shop(world: World, tenants: TenantStore, counters: Counters) -> Site:
    """The shop's app (routes on a `Site`)."""
    site = Site(
        name="shopping",
        title="One Stop Market",
        nav=[("My Account", "/account"), ("My Cart", "/cart")],
        world=world,
        tenants=tenants,
        counters=counters,
        login_label="Email",
    )

    def customer(req: Req) -> Customer:
        email = req.require_login()
        found = customer_by_email(req.tenant, world, email)
        if found is None:  # pragma: no cover - the default account always exists
            raise Redirect("/login")
        return found

    async def home(req: Req) -> Response:
        categories = req.tenant.all(world.categories)
        featured = [req.tenant.get(world.products, pid) for pid in (7, 31, 55, 79, 103, 127)]
        return req.render(
            "shop/home.html", categories=categories, featured=[p for p in featured if p]
        )

    async def category(req: Req) -> Response:
        slug = req.request.path_params["slug"]
        found = [c for c in req.tenant.all(world.categories) if c.slug == slug]
        if not found:
            return req.not_found(f"No category '{slug}'.")
        sort = req.arg("sort", "name")
        sort = sort if sort in SORTS else "name"
        products = category_products(req.tenant, world, found[0].id, sort)
        return req.render(
            "shop/list.html",
            heading=found[0].name,
            page=paginate(products, req, PRODUCTS_PER_PAGE),
            ratings={p.id: rating(req.tenant, world, p.id) for p in products},
            sorts=SORTS,
            sort=sort,
            query="",
        )

    async def search(req: Req) -> Response:
        query = req.arg("q")
        products = search_products(req.tenant, world, query)
        return req.render(
            "shop/list.html",
            heading=f"Search results for: '{query}'",
            page=paginate(products, req, PRODUCTS_PER_PAGE),
            ratings={p.id: rating(req.tenant, world, p.id) for p in products},
            sorts={},
            sort="",
            query=query,
        )

    async def product(req: Req) -> Response:
        item = req.tenant.get(world.products, req.path_int("product_id"))
        if item is None:
            return req.not_found("No such product.")
        cat = req.tenant.get(world.categories, item.category_id)
        reviews = req.tenant.where(world.reviews, "product_id", item.id)
        return req.render(
            "shop/product.html",
            product=item,
            category=cat,
            rating=rating(req.tenant, world, item.id),
            reviews=list(reversed(reviews)),
        )

    async def add_to_cart(req: Req) -> Response:
        who = customer(req)
        item = req.tenant.get(world.products, req.path_int("product_id"))
        if item is None or not item.enabled:
            return req.not_found("No such product.")
        form = await req.form()
        try:
            qty = int(form.get("qty", "1"))
        except ValueError:
            qty = 0
        if not 1 <= qty <= 99:
            req.flash("Please enter a quantity between 1 and 99.")
            raise Redirect(f"/product/{item.id}")
        existing = [line for line, p in _cart(req.tenant, world, who.id) if p.id == item.id]
        if existing:
            req.tenant.put(world.cart, msgspec.structs.replace(existing[0], qty=qty))
        else:
            req.tenant.insert(
                world.cart,
                lambda new_id: CartLine(id=new_id, customer_id=who.id, product_id=item.id, qty=qty),
            )
        req.flash(f"You added {item.name} to your shopping cart.")
        raise Redirect(f"/product/{item.id}")

    async def add_review(req: Req) -> Response:
        who = customer(req)
        item = req.tenant.get(world.products, req.path_int("product_id"))
        if item is None:
            return req.not_found("No such product.")
        form = await req.form()
        stars = form.get("rating", "")
        if stars not in {"1", "2", "3", "4", "5"} or not form.get("title") or not form.get("text"):
            req.flash("Please choose a rating and fill in the summary and the review.")
            raise Redirect(f"/product/{item.id}")
        req.tenant.insert(
            world.reviews,
            lambda new_id: Review(
                id=new_id,
                product_id=item.id,
                author=f"{who.first_name} {who.last_name[0]}.",
                rating=int(stars),
                title=form["title"],
                text=form["text"],
                date=TODAY,
            ),
        )
        req.flash("You submitted your review for moderation.")
        raise Redirect(f"/product/{item.id}")

    async def cart(req: Req) -> Response:
        who = customer(req)
        lines = _cart(req.tenant, world, who.id)
        total = sum(line.qty * p.price_cents for line, p in lines)
        return req.render("shop/cart.html", lines=lines, total=total)

    async def remove_from_cart(req: Req) -> Response:
        who = customer(req)
        form = await req.form()
        for line, _ in _cart(req.tenant, world, who.id):
            if str(line.id) == form.get("line"):
                req.tenant.delete(world.cart, line.id)
        raise Redirect("/cart")

    async def checkout(req: Req) -> Response:
        who = customer(req)
        lines = _cart(req.tenant, world, who.id)
        if not lines:
            req.flash("You have no items in your shopping cart.")
            raise Redirect("/cart")
        return req.render(
            "shop/checkout.html",
            customer=who,
            lines=lines,
            subtotal=sum(line.qty * p.price_cents for line, p in lines),
            shipping=SHIPPING,
        )

    async def place_order(req: Req) -> Response:
        who = customer(req)
        form = await req.form()
        lines = _cart(req.tenant, world, who.id)
        method = form.get("shipping", "")
        if not lines or method not in SHIPPING:
            req.flash("Please choose a shipping method.")
            raise Redirect("/checkout")
        order = req.tenant.insert(
            world.orders,
            lambda new_id: Order(
                id=new_id,
                customer_id=who.id,
                date=TODAY,
                status="Pending",
                shipping=method,
                shipping_cents=SHIPPING[method],
                items=tuple(
                    OrderItem(
                        product_id=p.id,
                        name=p.name,
                        sku=p.sku,
                        price_cents=p.price_cents,
                        qty=line.qty,
                    )
                    for line, p in lines
                ),
            ),
        )
        for line, _ in lines:
            req.tenant.delete(world.cart, line.id)
        raise Redirect(f"/checkout/success/{order.id}")

    async def success(req: Req) -> Response:
        customer(req)
        return req.render("shop/success.html", order_id=req.path_int("order_id"))

    async def account(req: Req) -> Response:
        who = customer(req)
        orders = customer_orders(req.tenant, world, who.id)
        return req.render("shop/account.html", customer=who, recent=orders[:3])

    async def account_edit(req: Req) -> Response:
        return req.render("shop/account_edit.html", customer=customer(req))

    async def account_save(req: Req) -> Response:
        who = customer(req)
        form = await req.form()
        fields = {k: form.get(k, "") for k in ("first_name", "last_name", "phone")}
        if not all(fields.values()):
            req.flash("Please fill in first name, last name and phone number.")
            raise Redirect("/account/edit")
        req.tenant.put(world.customers, msgspec.structs.replace(who, **fields))
        req.flash("You saved the account information.")
        raise Redirect("/account")

    async def orders(req: Req) -> Response:
        who = customer(req)
        found = customer_orders(req.tenant, world, who.id)
        return req.render("shop/orders.html", page=paginate(found, req, ORDERS_PER_PAGE))

    async def order(req: Req) -> Response:
        who = customer(req)
        found = req.tenant.get(world.orders, req.path_int("order_id"))
        if found is None or found.customer_id != who.id:
            return req.not_found("No such order in your account.")
        return req.render("shop/order.html", order=found)

    site.add("/", home)
    site.add("/category/{slug}", category)
    site.add("/search", search)
    site.add("/product/{product_id:int}", product)
    site.add("/product/{product_id:int}/cart", add_to_cart, methods=["POST"])
    site.add("/product/{product_id:int}/review", add_review, methods=["POST"])
    site.add("/cart", cart)
    site.add("/cart/remove", remove_from_cart, methods=["POST"])
    site.add("/checkout", checkout)
    site.add("/checkout", place_order, methods=["POST"])
    site.add("/checkout/success/{order_id:int}", success)
    site.add("/account", account)
    site.add("/account/edit", account_edit)
    site.add("/account/edit", account_save, methods=["POST"])
    site.add("/account/orders", orders)
    site.add("/account/orders/{order_id:int}", order)
    return site
