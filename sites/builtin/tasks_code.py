"""Task templates of the code host (GITLAB): ids 401-499."""

from __future__ import annotations

import random

from runtime.base.messages import OracleStep
from sites.builtin import words
from sites.builtin.code import (
    COMMITS_PER_PAGE,
    ISSUES_PER_PAGE,
    PROJECTS_PER_PAGE,
    project_commits,
    project_issues,
    project_members,
    project_merge_requests,
    sorted_projects,
)
from sites.builtin.data import ACCOUNTS, ROLES, World
from sites.builtin.records import Issue, Project
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

SITE = "gitlab"
USER = ACCOUNTS[SITE].username


def _project(world: World, base: Tenant, path: str) -> tuple[int, Project]:
    """The project and its index on the Explore page."""
    for index, project in enumerate(sorted_projects(base, world)):
        if project.path == path:
            return index, project
    raise ValueError(f"no project {path!r}")


def _projects(world: World, base: Tenant) -> list[dict[str, str]]:
    return [{"project": p.path} for p in sorted_projects(base, world)]


def _explore_to(path: str, index: int) -> list[OracleStep]:
    return [
        link("Explore projects", "Open the list of all projects."),
        *next_pages(index, PROJECTS_PER_PAGE, "The project"),
    ]


def _open_project(world: World, base: Tenant, p: dict[str, str]) -> Built:
    index, project = _project(world, base, p["project"])
    return Built(
        intent=f"Open the project {project.path}.",
        start="/",
        eval=url_match(SITE, f"/{project.path}"),
        plan=[
            *_explore_to(project.path, index),
            link(project.path, f"Open {project.path}."),
            exit_with("", "The project is open."),
        ],
    )


def _stars(world: World, base: Tenant, p: dict[str, str]) -> Built:
    index, project = _project(world, base, p["project"])
    stars = str(project.stars)
    return Built(
        intent=f"How many stars does the project {project.path} have?",
        start="/",
        eval=string_match(exact=stars),
        plan=[
            *_explore_to(project.path, index),
            exit_with(stars, f"The list shows {stars} stars for {project.path}."),
        ],
    )


def _open_issue_count(world: World, base: Tenant, p: dict[str, str]) -> Built:
    index, project = _project(world, base, p["project"])
    count = str(len(project_issues(base, world, project.id)))
    return Built(
        intent=f"How many open issues does the project {project.path} have?",
        start="/explore",
        eval=string_match(exact=count),
        plan=[
            *next_pages(index, PROJECTS_PER_PAGE, "The project"),
            link(project.path, f"Open {project.path}."),
            exit_with(count, f"The project page shows {count} open issues."),
        ],
    )


def _issue(world: World, base: Tenant, project: Project, title: str) -> Issue:
    found = [i for i in base.where(world.issues, "project_id", project.id) if i.title == title]
    if not found:
        raise ValueError(f"no issue {title!r} in {project.path}")
    return found[0]


def _to_issue_in_list(
    world: World, base: Tenant, project: Project, issue: Issue
) -> list[OracleStep]:
    """From the project page to the issues page that lists `issue`."""
    steps = [link("Issues", "Open the issues of the project.")]
    state = "opened"
    if issue.state != "opened":
        state = "all"
        steps.append(link("All", "The issue is not open; show all issues."))
    listed = project_issues(base, world, project.id, state)
    index = next(i for i, item in enumerate(listed) if item.id == issue.id)
    return [*steps, *next_pages(index, ISSUES_PER_PAGE, "The issue")]


def _assigned_issues(world: World, base: Tenant) -> list[dict[str, str]]:
    return [
        {"project": p.path, "title": i.title}
        for p in sorted_projects(base, world)
        for i in base.where(world.issues, "project_id", p.id)
        if i.assignee
    ]


def _assignee(world: World, base: Tenant, p: dict[str, str]) -> Built:
    _, project = _project(world, base, p["project"])
    issue = _issue(world, base, project, p["title"])
    return Built(
        intent=f"Who is assigned to the issue '{issue.title}' in {project.path}?",
        start=f"/{project.path}",
        eval=string_match(exact=issue.assignee),
        plan=[
            *_to_issue_in_list(world, base, project, issue),
            exit_with(issue.assignee, f"The issue is assigned to {issue.assignee}."),
        ],
    )


def _label_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    return [
        {"project": p.path, "label": label}
        for p in sorted_projects(base, world)
        for label in p.labels
    ]


def _label_filter(world: World, base: Tenant, p: dict[str, str]) -> Built:
    _, project = _project(world, base, p["project"])
    return Built(
        intent=f"Show the open issues of {project.path} labeled {p['label']}.",
        start=f"/{project.path}",
        eval=url_match(SITE, f"/{project.path}/-/issues?state=opened&label={p['label']}"),
        plan=[
            link("Issues", "Open the issues of the project."),
            select("label", p["label"], f"Choose the label {p['label']}."),
            button("Filter", "Apply the filter."),
            exit_with("", "The filtered list is shown."),
        ],
    )


def _commit_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    found = []
    for project in sorted_projects(base, world):
        for commit in project_commits(base, world, project.id)[: COMMITS_PER_PAGE * 2]:
            found.append({"project": project.path, "sha": commit.sha[:8]})
    return found


def _commit_message(world: World, base: Tenant, p: dict[str, str]) -> Built:
    _, project = _project(world, base, p["project"])
    commits = project_commits(base, world, project.id)
    index = next(i for i, c in enumerate(commits) if c.sha.startswith(p["sha"]))
    message = commits[index].message
    return Built(
        intent=f"What is the message of the commit {p['sha']} in {project.path}?",
        start=f"/{project.path}",
        eval=string_match(exact=message),
        plan=[
            link("Commits", "Open the commits of the project."),
            *next_pages(index, COMMITS_PER_PAGE, "The commit"),
            exit_with(message, f"Commit {p['sha']} says '{message}'."),
        ],
    )


def _new_issue_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    rng = random.Random(f"{world.seed}:code-new-issue")
    found = []
    for project in sorted_projects(base, world):
        existing = {i.title for i in base.where(world.issues, "project_id", project.id)}
        members = [m.username for m in project_members(base, world, project.id)]
        for _ in range(12):
            title = rng.choice(words.ISSUE_PROBLEMS).format(area=rng.choice(words.ISSUE_AREAS))
            if title in existing:
                continue
            existing.add(title)
            found.append(
                {
                    "project": project.path,
                    "title": title,
                    "label": rng.choice(project.labels),
                    "assignee": rng.choice(members),
                }
            )
    return found


def _create_issue(world: World, base: Tenant, p: dict[str, str]) -> Built:
    index, project = _project(world, base, p["project"])
    iid = 1 + max(i.iid for i in base.where(world.issues, "project_id", project.id))
    url = f"/{project.path}/-/issues/{iid}"
    return Built(
        intent=f"Create an issue in {project.path} titled '{p['title']}' with the label "
        f"{p['label']} and assign it to {p['assignee']}.",
        start="/",
        eval=program_html(
            SITE,
            [
                (
                    url,
                    "document.querySelector('#issue-title')?.outerText ?? ''",
                    {"exact_match": p["title"]},
                ),
                (
                    url,
                    "document.querySelector('#issue-labels')?.outerText ?? ''",
                    {"must_include": [p["label"]]},
                ),
                (
                    url,
                    "document.querySelector('#issue-assignee')?.outerText ?? ''",
                    {"exact_match": p["assignee"]},
                ),
            ],
        ),
        plan=[
            *_explore_to(project.path, index),
            link(project.path, f"Open {project.path}."),
            link("Issues", "Open the issues."),
            link("New issue", "Start a new issue."),
            type_into("title", p["title"], "Enter the title."),
            select("label", p["label"], f"Choose the label {p['label']}."),
            select("assignee", p["assignee"], f"Assign it to {p['assignee']}."),
            button("Create issue", "Create the issue."),
            exit_with("", "The issue is created."),
        ],
        require_login=True,
        require_reset=True,
    )


def _open_issues(world: World, base: Tenant) -> list[dict[str, str]]:
    return [
        {"project": p.path, "title": i.title}
        for p in sorted_projects(base, world)
        for i in project_issues(base, world, p.id)
    ]


def _close_issue(world: World, base: Tenant, p: dict[str, str]) -> Built:
    _, project = _project(world, base, p["project"])
    issue = _issue(world, base, project, p["title"])
    return Built(
        intent=f"Close the issue '{issue.title}' in {project.path}.",
        start=f"/{project.path}",
        eval=program_html(
            SITE,
            [
                (
                    f"/{project.path}/-/issues/{issue.iid}",
                    "document.querySelector('#issue-state').outerText",
                    {"exact_match": "Closed"},
                )
            ],
        ),
        plan=[
            *_to_issue_in_list(world, base, project, issue),
            link(issue.title, "Open the issue."),
            button("Close issue", "Close the issue."),
            exit_with("", "The issue is closed."),
        ],
        require_login=True,
        require_reset=True,
    )


def _assign_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    rng = random.Random(f"{world.seed}:code-assign")
    found = []
    for item in _open_issues(world, base):
        _, project = _project(world, base, item["project"])
        issue = _issue(world, base, project, item["title"])
        members = [m.username for m in project_members(base, world, project.id)]
        others = [m for m in members if m != issue.assignee]
        if others:
            found.append({**item, "user": rng.choice(others)})
    return found


def _assign(world: World, base: Tenant, p: dict[str, str]) -> Built:
    _, project = _project(world, base, p["project"])
    issue = _issue(world, base, project, p["title"])
    return Built(
        intent=f"Assign the issue '{issue.title}' in {project.path} to {p['user']}.",
        start=f"/{project.path}",
        eval=program_html(
            SITE,
            [
                (
                    f"/{project.path}/-/issues/{issue.iid}",
                    "document.querySelector('#issue-assignee').outerText",
                    {"exact_match": p["user"]},
                )
            ],
        ),
        plan=[
            *_to_issue_in_list(world, base, project, issue),
            link(issue.title, "Open the issue."),
            select("assignee", p["user"], f"Choose {p['user']}."),
            button("Assign", "Save the assignee."),
            exit_with("", "The issue is assigned."),
        ],
        require_login=True,
        require_reset=True,
    )


def _unstarred(world: World, base: Tenant) -> list[dict[str, str]]:
    mine = {s.project_id for s in base.where(world.stars, "username", USER)}
    return [{"project": p.path} for p in sorted_projects(base, world) if p.id not in mine]


def _star(world: World, base: Tenant, p: dict[str, str]) -> Built:
    index, project = _project(world, base, p["project"])
    return Built(
        intent=f"Star the project {project.path}.",
        start="/",
        eval=program_html(
            SITE,
            [
                (
                    f"/{project.path}",
                    "document.querySelector('#star-button').outerText",
                    {"exact_match": "Unstar"},
                ),
                (
                    f"/{project.path}",
                    "document.querySelector('#star-count').outerText",
                    {"exact_match": str(project.stars + 1)},
                ),
            ],
        ),
        plan=[
            *_explore_to(project.path, index),
            link(project.path, f"Open {project.path}."),
            button("Star", "Star the project."),
            exit_with("", "The project is starred."),
        ],
        require_login=True,
        require_reset=True,
    )


def _member_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    rng = random.Random(f"{world.seed}:code-member")
    users = [u.username for u in base.all(world.code_users)]
    found = []
    for project in sorted_projects(base, world):
        current = {m.username for m in project_members(base, world, project.id)}
        for user in rng.sample([u for u in users if u not in current], 4):
            found.append({"project": project.path, "user": user, "role": rng.choice(ROLES[:4])})
    return found


def _add_member(world: World, base: Tenant, p: dict[str, str]) -> Built:
    _, project = _project(world, base, p["project"])
    rows = "[...document.querySelectorAll('#members tr')].map(r => r.outerText).join('\\n')"
    return Built(
        intent=f"Add {p['user']} to the project {project.path} as {p['role']}.",
        start=f"/{project.path}",
        eval=program_html(
            SITE,
            [
                (
                    f"/{project.path}/-/project_members",
                    rows,
                    {"must_include": [f"{p['user']} {p['role']}"]},
                )
            ],
        ),
        plan=[
            link("Members", "Open the members of the project."),
            type_into("username", p["user"], f"Enter the username {p['user']}."),
            select("role", p["role"], f"Choose the role {p['role']}."),
            button("Invite", "Invite the user."),
            exit_with("", "The member is added."),
        ],
        require_login=True,
        require_reset=True,
    )


def _mr_candidates(world: World, base: Tenant) -> list[dict[str, str]]:
    return [
        {"project": p.path, "title": m.title}
        for p in sorted_projects(base, world)
        for m in project_merge_requests(base, world, p.id, "all")
        if len(project_merge_requests(base, world, p.id, m.state)) <= ISSUES_PER_PAGE
    ]


def _mr_target(world: World, base: Tenant, p: dict[str, str]) -> Built:
    _, project = _project(world, base, p["project"])
    mr = next(
        m for m in project_merge_requests(base, world, project.id, "all") if m.title == p["title"]
    )
    steps = [link("Merge requests", "Open the merge requests.")]
    if mr.state != "opened":
        steps.append(link(mr.state.title(), f"The merge request is {mr.state}; open that tab."))
    return Built(
        intent=f"What is the target branch of the merge request '{mr.title}' in {project.path}?",
        start=f"/{project.path}",
        eval=string_match(exact=mr.target_branch),
        plan=[
            *steps,
            link(mr.title, "Open the merge request."),
            exit_with(mr.target_branch, f"It targets {mr.target_branch}."),
        ],
    )


TEMPLATES = [
    Template(401, SITE, "open_project", "Open the project {project}.", _projects, _open_project),
    Template(
        402,
        SITE,
        "project_stars",
        "How many stars does the project {project} have?",
        _projects,
        _stars,
    ),
    Template(
        403,
        SITE,
        "issue_assignee",
        "Who is assigned to the issue '{title}' in {project}?",
        _assigned_issues,
        _assignee,
        train_cap=40,
    ),
    Template(
        404,
        SITE,
        "open_issue_count",
        "How many open issues does the project {project} have?",
        _projects,
        _open_issue_count,
    ),
    Template(
        405,
        SITE,
        "label_filter",
        "Show the open issues of {project} labeled {label}.",
        _label_candidates,
        _label_filter,
    ),
    Template(
        406,
        SITE,
        "commit_message",
        "What is the message of the commit {sha} in {project}?",
        _commit_candidates,
        _commit_message,
        train_cap=40,
    ),
    Template(
        407,
        SITE,
        "create_issue",
        "Create an issue in {project} titled '{title}' with the label {label} and assign it "
        "to {assignee}.",
        _new_issue_candidates,
        _create_issue,
    ),
    Template(
        408,
        SITE,
        "close_issue",
        "Close the issue '{title}' in {project}.",
        _open_issues,
        _close_issue,
    ),
    Template(
        409,
        SITE,
        "assign_issue",
        "Assign the issue '{title}' in {project} to {user}.",
        _assign_candidates,
        _assign,
    ),
    Template(
        410,
        SITE,
        "star_project",
        "Star the project {project}.",
        _unstarred,
        _star,
        ood=True,
        train_cap=12,
    ),
    Template(
        411,
        SITE,
        "add_member",
        "Add {user} to the project {project} as {role}.",
        _member_candidates,
        _add_member,
        ood=True,
        train_cap=12,
    ),
    Template(
        412,
        SITE,
        "mr_target",
        "What is the target branch of the merge request '{title}' in {project}?",
        _mr_candidates,
        _mr_target,
    ),
]
