"""The code host (GITLAB, like GitLab): projects, issues, merge requests, commits, members."""

from __future__ import annotations

import msgspec
from starlette.responses import Response

from sites.builtin.data import NOW, ROLES, World
from sites.builtin.records import Commit, Issue, IssueNote, Member, MergeRequest, Project, Star
from sites.builtin.tenants import Tenant, TenantStore
from sites.builtin.web import Counters, Redirect, Req, Site, paginate

__all__ = [
    "COMMITS_PER_PAGE",
    "ISSUES_PER_PAGE",
    "PROJECTS_PER_PAGE",
    "build_code",
    "project_by_path",
    "project_commits",
    "project_issues",
    "project_members",
    "project_merge_requests",
    "sorted_projects",
]

PROJECTS_PER_PAGE = 10
ISSUES_PER_PAGE = 10
COMMITS_PER_PAGE = 10
ISSUE_STATES = {"opened": "Open", "closed": "Closed", "all": "All"}
MR_STATES = {"opened": "Open", "merged": "Merged", "closed": "Closed", "all": "All"}


def sorted_projects(tenant: Tenant, world: World, query: str = "") -> list[Project]:
    """Projects whose path contains `query`, by path."""
    needle = query.lower().strip()
    found = [p for p in tenant.all(world.projects) if needle in p.path.lower()]
    return sorted(found, key=lambda p: p.path)


def project_by_path(tenant: Tenant, world: World, namespace: str, name: str) -> Project | None:
    found = [p for p in tenant.all(world.projects) if p.namespace == namespace and p.name == name]
    return found[0] if found else None


def project_issues(
    tenant: Tenant, world: World, project_id: int, state: str = "opened", label: str = ""
) -> list[Issue]:
    """Issues of a project, newest (highest iid) first."""
    issues = tenant.where(world.issues, "project_id", project_id)
    return sorted(
        (i for i in issues if state in ("all", i.state) and (not label or label in i.labels)),
        key=lambda i: -i.iid,
    )


def project_merge_requests(
    tenant: Tenant, world: World, project_id: int, state: str = "opened"
) -> list[MergeRequest]:
    mrs = tenant.where(world.merge_requests, "project_id", project_id)
    return sorted((m for m in mrs if state in ("all", m.state)), key=lambda m: -m.iid)


def project_commits(tenant: Tenant, world: World, project_id: int) -> list[Commit]:
    """Commits, newest first."""
    commits = tenant.where(world.commits, "project_id", project_id)
    return sorted(commits, key=lambda c: (c.date, c.id), reverse=True)


def project_members(tenant: Tenant, world: World, project_id: int) -> list[Member]:
    return sorted(tenant.where(world.members, "project_id", project_id), key=lambda m: m.username)


def build_code(world: World, tenants: TenantStore, counters: Counters) -> Site:
    """The code host's app."""
    site = Site(
        name="gitlab",
        title="GitLab",
        nav=[("Explore projects", "/explore")],
        world=world,
        tenants=tenants,
        counters=counters,
    )

    def project_of(req: Req) -> Project | None:
        params = req.request.path_params
        return project_by_path(req.tenant, world, params["namespace"], params["project"])

    def issue_of(req: Req, project: Project) -> Issue | None:
        iid = req.path_int("iid")
        found = [
            i for i in req.tenant.where(world.issues, "project_id", project.id) if i.iid == iid
        ]
        return found[0] if found else None

    def starred(req: Req, project: Project) -> Star | None:
        if req.user is None:
            return None
        mine = [
            s
            for s in req.tenant.where(world.stars, "project_id", project.id)
            if s.username == req.user
        ]
        return mine[0] if mine else None

    async def home(req: Req) -> Response:
        mine: list[Project] = []
        if req.user:
            ids = {m.project_id for m in req.tenant.where(world.members, "username", req.user)}
            mine = [p for p in sorted_projects(req.tenant, world) if p.id in ids]
        return req.render("code/home.html", projects=mine)

    async def explore(req: Req) -> Response:
        query = req.arg("q")
        found = sorted_projects(req.tenant, world, query)
        return req.render(
            "code/explore.html", page=paginate(found, req, PROJECTS_PER_PAGE), query=query
        )

    async def project(req: Req) -> Response:
        found = project_of(req)
        if found is None:
            return req.not_found("Project not found.")
        commits = project_commits(req.tenant, world, found.id)
        return req.render(
            "code/project.html",
            project=found,
            starred=starred(req, found) is not None,
            open_issues=len(project_issues(req.tenant, world, found.id)),
            open_mrs=len(project_merge_requests(req.tenant, world, found.id)),
            latest=commits[0] if commits else None,
        )

    async def star(req: Req) -> Response:
        user = req.require_login()
        found = project_of(req)
        if found is None:
            return req.not_found("Project not found.")
        mine = starred(req, found)
        if mine is not None:
            req.tenant.delete(world.stars, mine.id)
            req.tenant.put(world.projects, msgspec.structs.replace(found, stars=found.stars - 1))
        else:
            req.tenant.insert(
                world.stars, lambda new_id: Star(id=new_id, project_id=found.id, username=user)
            )
            req.tenant.put(world.projects, msgspec.structs.replace(found, stars=found.stars + 1))
        raise Redirect(f"/{found.path}")

    async def issues(req: Req) -> Response:
        found = project_of(req)
        if found is None:
            return req.not_found("Project not found.")
        state = req.arg("state", "opened")
        state = state if state in ISSUE_STATES else "opened"
        label = req.arg("label")
        listed = project_issues(req.tenant, world, found.id, state, label)
        return req.render(
            "code/issues.html",
            project=found,
            page=paginate(listed, req, ISSUES_PER_PAGE),
            state=state,
            states=ISSUE_STATES,
            label=label,
        )

    async def issue(req: Req) -> Response:
        found = project_of(req)
        item = issue_of(req, found) if found else None
        if found is None or item is None:
            return req.not_found("Issue not found.")
        return req.render(
            "code/issue.html",
            project=found,
            issue=item,
            notes=req.tenant.where(world.notes, "issue_id", item.id),
            members=project_members(req.tenant, world, found.id),
        )

    async def issue_action(req: Req) -> Response:
        user = req.require_login()
        found = project_of(req)
        item = issue_of(req, found) if found else None
        if found is None or item is None:
            return req.not_found("Issue not found.")
        form = await req.form()
        action = req.request.path_params["action"]
        members = {m.username for m in project_members(req.tenant, world, found.id)}
        changed = item
        if action == "close":
            changed = msgspec.structs.replace(item, state="closed")
        elif action == "reopen":
            changed = msgspec.structs.replace(item, state="opened")
        elif action == "assign" and (form.get("assignee") in members or form.get("assignee") == ""):
            changed = msgspec.structs.replace(item, assignee=form["assignee"])
        elif action == "label" and form.get("label") in found.labels:
            labels = tuple(sorted({*item.labels, form["label"]}))
            changed = msgspec.structs.replace(item, labels=labels)
        elif action == "note" and form.get("note"):
            req.tenant.insert(
                world.notes,
                lambda new_id: IssueNote(
                    id=new_id, issue_id=item.id, author=user, body=form["note"], created=NOW
                ),
            )
        else:
            req.flash("Nothing was changed: choose a value first.")
        if changed is not item:
            req.tenant.put(world.issues, changed)
        raise Redirect(f"/{found.path}/-/issues/{item.iid}")

    async def new_issue_page(req: Req) -> Response:
        req.require_login()
        found = project_of(req)
        if found is None:
            return req.not_found("Project not found.")
        return req.render(
            "code/new_issue.html",
            project=found,
            members=project_members(req.tenant, world, found.id),
            error="",
        )

    async def new_issue(req: Req) -> Response:
        user = req.require_login()
        found = project_of(req)
        if found is None:
            return req.not_found("Project not found.")
        form = await req.form()
        members = project_members(req.tenant, world, found.id)
        label, assignee = form.get("label", ""), form.get("assignee", "")
        if (
            not form.get("title")
            or (label and label not in found.labels)
            or (assignee and assignee not in {m.username for m in members})
        ):
            return req.render(
                "code/new_issue.html",
                status=400,
                project=found,
                members=members,
                error="A title is required; label and assignee must be from the lists.",
            )
        iid = 1 + max(
            (i.iid for i in req.tenant.where(world.issues, "project_id", found.id)), default=0
        )
        req.tenant.insert(
            world.issues,
            lambda new_id: Issue(
                id=new_id,
                project_id=found.id,
                iid=iid,
                title=form["title"],
                description=form.get("description", ""),
                state="opened",
                author=user,
                assignee=assignee,
                labels=(label,) if label else (),
                created=NOW,
            ),
        )
        raise Redirect(f"/{found.path}/-/issues/{iid}")

    async def merge_requests(req: Req) -> Response:
        found = project_of(req)
        if found is None:
            return req.not_found("Project not found.")
        state = req.arg("state", "opened")
        state = state if state in MR_STATES else "opened"
        listed = project_merge_requests(req.tenant, world, found.id, state)
        return req.render(
            "code/merge_requests.html",
            project=found,
            page=paginate(listed, req, ISSUES_PER_PAGE),
            state=state,
            states=MR_STATES,
        )

    async def merge_request(req: Req) -> Response:
        found = project_of(req)
        if found is None:
            return req.not_found("Project not found.")
        iid = req.path_int("iid")
        mrs = [
            m
            for m in req.tenant.where(world.merge_requests, "project_id", found.id)
            if m.iid == iid
        ]
        if not mrs:
            return req.not_found("Merge request not found.")
        return req.render("code/merge_request.html", project=found, mr=mrs[0])

    async def commits(req: Req) -> Response:
        found = project_of(req)
        if found is None:
            return req.not_found("Project not found.")
        listed = project_commits(req.tenant, world, found.id)
        return req.render(
            "code/commits.html", project=found, page=paginate(listed, req, COMMITS_PER_PAGE)
        )

    async def members(req: Req) -> Response:
        found = project_of(req)
        if found is None:
            return req.not_found("Project not found.")
        return req.render(
            "code/members.html",
            project=found,
            members=project_members(req.tenant, world, found.id),
            roles=ROLES[:4],
            error="",
        )

    async def invite(req: Req) -> Response:
        req.require_login()
        found = project_of(req)
        if found is None:
            return req.not_found("Project not found.")
        form = await req.form()
        username, role = form.get("username", ""), form.get("role", "")
        current = project_members(req.tenant, world, found.id)
        known = req.tenant.where(world.code_users, "username", username)
        if not known or role not in ROLES[:4] or username in {m.username for m in current}:
            return req.render(
                "code/members.html",
                status=400,
                project=found,
                members=current,
                roles=ROLES[:4],
                error="Enter the username of a user who is not a member yet, and choose a role.",
            )
        req.tenant.insert(
            world.members,
            lambda new_id: Member(id=new_id, project_id=found.id, username=username, role=role),
        )
        req.flash(f"{username} was added to the project as {role}.")
        raise Redirect(f"/{found.path}/-/project_members")

    base = "/{namespace}/{project}"
    site.add("/", home)
    site.add("/explore", explore)
    site.add(base, project)
    site.add(f"{base}/star", star, methods=["POST"])
    site.add(f"{base}/-/issues", issues)
    site.add(f"{base}/-/issues/new", new_issue_page)
    site.add(f"{base}/-/issues/new", new_issue, methods=["POST"])
    site.add(f"{base}/-/issues/{{iid:int}}", issue)
    site.add(f"{base}/-/issues/{{iid:int}}/{{action}}", issue_action, methods=["POST"])
    site.add(f"{base}/-/merge_requests", merge_requests)
    site.add(f"{base}/-/merge_requests/{{iid:int}}", merge_request)
    site.add(f"{base}/-/commits", commits)
    site.add(f"{base}/-/project_members", members)
    site.add(f"{base}/-/project_members", invite, methods=["POST"])
    return site
