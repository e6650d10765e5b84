"""Write the results page (docs/results.md) from the benchmarks' newest JSON files.

    .venv/bin/python -m bench.results [--out bench/out] [--page docs/results.md] [--check]

For each benchmark (`{bench}-{YYYYmmdd-HHMMSS}.json` in `--out`) the newest file gives one
table, the notes printed under it, the command that reproduces it, and the machine it ran
on (CPU count and model, load average during the run). The text between the markers
`<!-- results:start -->` and `<!-- results:end -->` in the page is replaced; nothing else
is touched. A benchmark with no JSON in `--out` keeps its section as the page has it
(results made on another machine stay until a new run replaces them). `--check` prints
the section instead of writing it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.common import format_cell
from runtime.base.files import write_atomic

START = "<!-- results:start -->"
END = "<!-- results:end -->"

# The order of the sections; benchmarks not listed here follow in name order.
ORDER = (
    "firstrun", "rollout", "serving", "keepalive", "compression", "hotswap", "learner", "pipeline",
    "recipe", "errors", "learning",
)  # fmt: skip

_NAME = re.compile(r"^(?P<bench>[a-z][a-z0-9_]*)-(?P<stamp>\d{8}-\d{6})\.json$")


def newest(folder: Path) -> dict[str, Path]:
    """The newest JSON file of each benchmark in `folder`, by the stamp in its name."""
    found: dict[str, tuple[str, Path]] = {}
    if not folder.is_dir():
        return {}
    for path in folder.iterdir():
        match = _NAME.match(path.name)
        if match is None:
            continue
        bench, stamp = match["bench"], match["stamp"]
        if bench not in found or stamp > found[bench][0]:
            found[bench] = (stamp, path)
    return {bench: path for bench, (_, path) in found.items()}


def _ordered(benches: Sequence[str]) -> list[str]:
    known = [b for b in ORDER if b in benches]
    return known + sorted(b for b in benches if b not in ORDER)


def _escape(cell: object) -> str:
    return str(cell).replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Sequence[object], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table."""
    lines = [
        "| " + " | ".join(_escape(h) for h in headers) + " |",
        "|" + "|".join("---:" if i else "---" for i in range(len(headers))) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(_escape(format_cell(v)) for v in row) + " |")
    return "\n".join(lines)


def _hotswap_table(record: Mapping[str, Any]) -> dict[str, Any]:
    """bench/hotswap.py's older record (no "table"): its phases as the table."""
    rows = []
    for phase, row in record.get("phases", {}).items():
        rows.append(
            [
                phase,
                float(row["seconds"]),
                row["requests"],
                float(row["requests_per_s"]),
                float(row["tokens_per_s"]),
                row["failed"],
                row["mixed_version"],
                row["versions_served"],
            ]
        )
    return {
        "title": f"hot-swap under load ({record.get('concurrency')} concurrent requests)",
        "headers": [
            "phase",
            "seconds",
            "requests",
            "req/s",
            "tok/s",
            "failed",
            "mixed",
            "versions",
        ],
        "rows": rows,
    }


def _hotswap_notes(record: Mapping[str, Any]) -> list[str]:
    pub, first = record.get("publish_s"), record.get("first_response_s")
    if not isinstance(pub, Mapping) or not isinstance(first, Mapping):
        return []
    return [
        f"{record.get('swaps')} swaps: publish (call -> routed) median "
        f"{float(pub['median']) * 1000:.0f} ms, p95 {float(pub['p95']) * 1000:.0f} ms; first "
        f"response from the new version median {float(first['median']) * 1000:.0f} ms, "
        f"p95 {float(first['p95']) * 1000:.0f} ms"
    ]


def _machine_line(machine: Mapping[str, Any]) -> str:
    if not machine:
        return "machine: not recorded"
    parts = [f"{machine.get('cpus', '?')} CPUs ({machine.get('cpu_model', 'unknown')})"]
    if "memory_gib" in machine:
        parts.append(f"{machine['memory_gib']} GiB")
    if "load_during_mean" in machine:
        parts.append(
            f"load average during the run: mean {machine['load_during_mean']}, "
            f"max {machine.get('load_during_max', '?')}"
        )
    elif "load_now" in machine:
        parts.append(f"load average at the end: {machine['load_now'][0]}")
    return "machine: " + "; ".join(parts)


def section(bench: str, record: Mapping[str, Any], source: str) -> str:
    """The markdown of one benchmark."""
    table = record.get("table")
    notes = list(record.get("notes", []))
    if not isinstance(table, Mapping) and bench == "hotswap":
        table = _hotswap_table(record)
        notes = _hotswap_notes(record) + notes
    command = record.get("command") or f".venv/bin/python -m bench.{bench}"
    lines = [f"### {bench}", ""]
    if isinstance(table, Mapping):
        if table.get("title"):
            lines += [str(table["title"]), ""]
        lines += [markdown_table(table.get("headers", []), table.get("rows", [])), ""]
    else:
        lines += ["(no table in this record)", ""]
    lines += [f"- {note}" for note in notes]
    machine = record.get("machine") if isinstance(record.get("machine"), Mapping) else {}
    finished = record.get("finished_at", "")
    lines += [
        f"- reproduce: `{command}`",
        f"- {_machine_line(machine or {})}" + (f"; finished {finished}" if finished else ""),
        f"- raw numbers: `{source}`",
        "",
    ]
    return "\n".join(lines)


def kept_sections(readme: str) -> dict[str, str]:
    """The page's generated sections by benchmark name ("### name" up to the next)."""
    start, end = readme.find(START), readme.find(END)
    if start < 0 or end < start:
        return {}
    block = readme[start + len(START) : end]
    found = list(re.finditer(r"^### ([a-z][a-z0-9_]*)[ \t]*$", block, flags=re.M))
    bounds = [m.start() for m in found[1:]] + [len(block)] if found else []
    return {
        m.group(1): block[m.start() : stop].strip("\n") + "\n"
        for m, stop in zip(found, bounds, strict=True)
    }


def render(folder: Path, kept: Mapping[str, str] | None = None) -> str:
    """The whole generated block (without the markers); `kept` sections fill the gaps."""
    files = newest(folder)
    kept = {name: text for name, text in (kept or {}).items() if name not in files}
    if not files and not kept:
        return f"\nNo benchmark results in `{folder}` yet: run the benchmarks in `bench/`.\n"
    parts = [
        "",
        "Generated by `.venv/bin/python -m bench.results` from the newest JSON of each "
        "benchmark in `bench/out/`. Medians over repeats; ratios are measured side by side "
        "in one run.",
        "",
    ]
    for bench in _ordered([*files, *kept]):
        if bench in kept:
            parts.append(kept[bench])
            continue
        path = files[bench]
        try:
            record = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError) as exc:
            parts.append(f"### {bench}\n\n(unreadable: {path.name}: {exc})\n")
            continue
        parts.append(section(bench, record, path.name))
    return "\n".join(parts)


def replace_section(readme: str, block: str) -> str:
    """`readme` with the text between the markers replaced by `block`."""
    start, end = readme.find(START), readme.find(END)
    if start < 0 or end < 0 or end < start:
        raise ValueError(f"the page needs the markers {START} and {END}, in that order")
    return readme[: start + len(START)] + "\n" + block.strip("\n") + "\n" + readme[end:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench/out", help="folder of the benchmarks' JSON")
    parser.add_argument("--page", default="docs/results.md", help="the Markdown file to update")
    parser.add_argument("--check", action="store_true", help="print the section, write nothing")
    args = parser.parse_args(argv)
    readme = Path(args.page)
    current = readme.read_text("utf-8") if readme.is_file() else ""
    block = render(Path(args.out), kept_sections(current))
    if args.check:
        print(block)
        return 0
    try:
        text = replace_section(current, block)
    except ValueError as exc:
        print(f"{readme}: {exc}", file=sys.stderr)
        return 2
    write_atomic(readme, text.encode())
    print(f"wrote the results of {len(newest(Path(args.out)))} benchmarks into {readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
