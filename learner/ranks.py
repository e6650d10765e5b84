"""The data-parallel learner on one host: rank 0 is the daemon's learner, ranks 1..N-1 are
processes of their own (`python -m learner.ranks`), started by rank 0.

    Learner (rank 0) ── open ──> Ranks.start: N-1 rank processes, one process group
          │                        each rank: Engine(data_parallel=...).open() (all agree
          │                        on the checkpoint's version and step)
          ├── update(batch) ──> broadcast (groups, set-aside ledger) ──> every rank
          │                     Engine.update on every rank: its share of the micro-batches,
          │                     gradients summed (learner.distributed), the same step
          │                     rank 0 alone saves the adapter and the checkpoint
          └── close ──────────> broadcast None: the ranks leave and exit 0

`learner.data_parallel = N` turns it on; with 1 (the default) nothing here runs. gloo on
the CPU, NCCL on GPUs (rank k on GPU k of the host). Every collective has
`learner.data_parallel_timeout_s`: a rank that died makes rank 0's next update fail with
`TrainingError` (naming the rank and its exit code), as any failed update does, instead of
waiting for ever; the checkpoint is the last one written, nothing is half-written. A rank
whose rank 0 is gone (SIGKILLed) exits by itself: it checks every second (3.4 s after a
SIGKILLed daemon, measured). The ranks resume the same state from the one learner folder.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import structlog

from learner.checkpoint import Ledger
from learner.distributed import DataParallel
from learner.engine import Engine
from learner.errors import TrainingError
from learner.precision import resolve_device
from runtime.base.config import LearnerConfig
from runtime.base.http import free_port
from runtime.base.messages import TrajectoryGroup

__all__ = ["Ranks", "main"]

log = structlog.get_logger("learner.ranks")


class _Update(msgspec.Struct, frozen=True):
    """What rank 0 sends every rank before an update (msgpack bytes in a broadcast)."""

    groups: list[TrajectoryGroup]
    set_aside: Ledger


def _start_group(
    config: LearnerConfig, *, rank: int, world_size: int, init_method: str
) -> DataParallel:
    return DataParallel.start(
        rank=rank,
        world_size=world_size,
        init_method=init_method,
        device=resolve_device(config.device),
        timeout_s=config.data_parallel_timeout_s,
    )


def _broadcast(payload: bytes | None) -> bytes | None:
    import torch.distributed as dist

    box: list[Any] = [payload]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[no-any-return]


class Ranks:
    """Rank 0's side: starts the other ranks and sends them each update's groups."""

    def __init__(self, engine: Engine, *, python: str = sys.executable) -> None:
        """The other ranks of `engine` (rank 0's), `engine.config.data_parallel` in all."""
        self.config = engine.config
        self.world_size = engine.config.data_parallel
        self._args = [
            "--base-model", engine.base_model, "--out-dir", str(engine.out_dir),
            "--adapter-prefix", engine.prefix, "--temperature", str(engine.temperature),
        ]  # fmt: skip
        self._python = python
        self._processes: list[subprocess.Popen[bytes]] = []
        self.data_parallel: DataParallel | None = None

    def start(self) -> DataParallel:
        """Start ranks 1..N-1 and join their process group (blocks; in a worker thread)."""
        init = f"tcp://127.0.0.1:{free_port()}"
        config = msgspec.json.encode(self.config).decode()
        for rank in range(1, self.world_size):
            cmd = [
                self._python, "-m", "learner.ranks", *self._args, "--config", config,
                "--rank", str(rank), "--world-size", str(self.world_size), "--init", init,
                "--parent", str(os.getpid()),
            ]  # fmt: skip
            self._processes.append(subprocess.Popen(cmd, env=dict(os.environ)))
        try:
            self.data_parallel = _start_group(
                self.config, rank=0, world_size=self.world_size, init_method=init
            )
        except Exception as exc:
            self._kill()
            raise TrainingError(f"data-parallel ranks did not join: {exc}{self._exits()}") from exc
        log.info("ranks.started", world_size=self.world_size, pids=self.pids)
        return self.data_parallel

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes]

    def _exits(self) -> str:
        gone = [(k + 1, p.poll()) for k, p in enumerate(self._processes) if p.poll() is not None]
        return "".join(f"; rank {rank} exited with code {code}" for rank, code in gone)

    def send(self, groups: Sequence[TrajectoryGroup], set_aside: Ledger) -> None:
        """Give every rank the update's groups (before rank 0's own `Engine.update`)."""
        update = _Update(list(groups), set_aside)
        try:
            _broadcast(msgspec.msgpack.encode(update))
        except Exception as exc:
            raise TrainingError(
                f"could not reach the data-parallel ranks: {exc}{self._exits()}"
            ) from exc

    def check(self, exc: BaseException) -> TrainingError:
        """The error of an update that failed in a collective, naming dead ranks."""
        return TrainingError(f"data-parallel update failed: {exc}{self._exits()}")

    def close(self, timeout_s: float = 60.0) -> None:
        """Tell the ranks to leave, wait for them (killed after `timeout_s`), leave too."""
        import torch.distributed as dist

        if self.data_parallel is not None and not any(
            p.poll() is not None for p in self._processes
        ):
            try:
                _broadcast(None)
            except Exception as exc:  # a rank already gone: the rest are killed below
                log.warning("ranks.close_failed", error=str(exc))
        for process in self._processes:
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.data_parallel is not None and dist.is_initialized():
            dist.destroy_process_group()
        self.data_parallel = None
        log.info("ranks.stopped", codes=[p.returncode for p in self._processes])

    def _kill(self) -> None:
        for process in self._processes:
            if process.poll() is None:
                process.kill()
            process.wait()


def _exit_with(parent: int, interval_s: float = 1.0) -> None:
    """Exit this process once `parent` is gone (rank 0 SIGKILLed: nobody is left to stop
    it, and it would otherwise wait in a collective until the timeout)."""
    while True:
        time.sleep(interval_s)
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            log.error("ranks.parent_gone", parent=parent)
            os._exit(1)


def main(argv: Sequence[str] | None = None) -> int:
    """A rank k > 0: open the engine, then run each update rank 0 sends until told to stop."""
    parser = argparse.ArgumentParser(prog="python -m learner.ranks")
    parser.add_argument("--config", required=True, help="LearnerConfig as JSON")
    parser.add_argument("--base-model", required=True)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--adapter-prefix", required=True)
    parser.add_argument("--temperature", type=float, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--init", required=True)
    parser.add_argument("--parent", type=int, required=True, help="rank 0's pid")
    args = parser.parse_args(argv)
    threading.Thread(target=_exit_with, args=(args.parent,), daemon=True).start()
    config = msgspec.json.decode(args.config, type=LearnerConfig)
    decode = None
    if config.mask_think:  # as rank 0's is: the model's own tokenizer
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.base_model)

        def decode(ids: Sequence[int]) -> str:
            return str(tokenizer.decode(list(ids), skip_special_tokens=True))

    dp = _start_group(config, rank=args.rank, world_size=args.world_size, init_method=args.init)
    engine = Engine(
        config,
        base_model=args.base_model,
        out_dir=args.out_dir,
        adapter_prefix=args.adapter_prefix,
        decode=decode,
        temperature=args.temperature,
        data_parallel=dp,
    )
    engine.open()
    while (payload := _broadcast(None)) is not None:
        update = msgspec.msgpack.decode(payload, type=_Update)
        engine.update(update.groups, update.set_aside)
    dp.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
