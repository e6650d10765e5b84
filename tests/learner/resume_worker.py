"""A learner process for the SIGKILL test: `python resume_worker.py MODEL OUT STORE`.

It plays the daemon's part: groups come from a trajectory-store file (JSON lines of
`TrajectoryGroup`); the learner re-reads the ones it consumed but did not train, and the
"runtime" sends every group the learner has not consumed yet, in store order, then closes
the stream. Log lines go to stdout as JSON (debug level: `learner.update_started` too).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import structlog

from learner.checkpoint import ConsumedJournal
from learner.lora import verify_adapter
from learner.trainer import Learner
from runtime.base.config import LearnerConfig
from runtime.base.messages import TrajectoryGroup, decode_group
from runtime.logs import configure_logging

CONFIG = LearnerConfig(
    batch_groups=2,
    lora_rank=4,
    lora_alpha=8,
    learning_rate=5e-3,
    optimizer_steps=3,
    micro_batch_tokens=256,
    max_staleness=1000,
    torch_threads=1,
)


def read_store(path: Path) -> list[TrajectoryGroup]:
    return [decode_group(line) for line in path.read_bytes().splitlines() if line.strip()]


async def main(model: Path, out: Path, store: Path) -> None:
    groups = read_store(store)
    by_id = {g.group_id: g for g in groups}

    def read_groups(ids: Sequence[str]) -> list[TrajectoryGroup]:
        return [by_id[i] for i in ids if i in by_id]

    async def publish(path: Path) -> None:
        verify_adapter(path)
        structlog.get_logger("worker").info("worker.published", name=path.name)

    consumed = set(ConsumedJournal(out / "consumed.jsonl").read())
    learner = Learner(
        CONFIG, base_model=model, out_dir=out, publish=publish, read_groups=read_groups
    )
    send, receive = anyio.create_memory_object_stream[TrajectoryGroup](0)
    async with anyio.create_task_group() as tg, send:
        await tg.start(learner.run, receive)
        for group in groups:
            if group.group_id not in consumed:
                await send.send(group)
    structlog.get_logger("worker").info("worker.done", version=learner.version)


if __name__ == "__main__":
    configure_logging(format="json", level="debug", stream=sys.stdout)
    anyio.run(main, *(Path(a) for a in sys.argv[1:4]))
