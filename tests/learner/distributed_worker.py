"""One rank of the data-parallel test (`test_distributed.py`):
`python distributed_worker.py MODEL OUT GROUPS CONFIG INIT_METHOD RANK WORLD RESULT`.

It joins a gloo process group, opens an engine with data parallelism on its own learner
folder (a copy of one checkpoint), makes one update on the groups of the GROUPS file
(JSON), and saves to RESULT (`torch.save`) what the test compares: its share of the
micro-batches, its own LoRA gradients before the all-reduce and the summed ones after,
the gradients the step used (after the clip), its adapter after the step, the metrics.
Then two more checks that need the process group: gradients missing on some ranks, and a
second engine opened on this rank's folder (rank 0 wrote v2 into its own, rank 1 did not),
which must refuse to start.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from peft import get_peft_model_state_dict

from learner.checkpoint import Ledger
from learner.distributed import DataParallel, all_reduce_gradients
from learner.engine import Engine
from learner.errors import CheckpointError
from runtime.base.config import LearnerConfig
from runtime.base.messages import TrajectoryGroup, decode


def _grads(params: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.detach().clone() for p in params]


class Recording(DataParallel):
    """Records the share this rank trains and its gradients around each all-reduce."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shares: list[list[list[tuple[str, str, int]]]] = []
        self.local: list[list[torch.Tensor | None]] = []
        self.summed: list[list[torch.Tensor | None]] = []

    def share(self, batches: Any) -> Any:
        mine = super().share(batches)
        self.shares.append([[(s.group_id, s.episode_id, s.turn) for s in mb] for mb in mine])
        return mine

    def all_reduce_gradients(self, params: Sequence[torch.Tensor]) -> None:
        self.local.append(_grads(params))
        super().all_reduce_gradients(params)
        self.summed.append(_grads(params))


def main(argv: Sequence[str]) -> None:
    model, out, groups_file, config_json, init_method, rank, world, result = argv
    config = decode(config_json.encode(), LearnerConfig)
    groups = decode(Path(groups_file).read_bytes(), list[TrajectoryGroup])
    torch.set_num_threads(1)
    dp = Recording.start(
        rank=int(rank), world_size=int(world), init_method=init_method, device="cpu"
    )
    try:
        assert isinstance(dp, Recording)
        engine = Engine(config, base_model=model, out_dir=out, data_parallel=dp)
        engine.open()
        update = engine.update(groups, Ledger())
        params = [p for p in engine._model.parameters() if p.requires_grad]
        adapter = {
            k: v.detach().clone() for k, v in get_peft_model_state_dict(engine._model).items()
        }

        # a gradient only rank 0 has, and one no rank has
        only_rank0 = torch.nn.Parameter(torch.zeros(3))
        nowhere = torch.nn.Parameter(torch.zeros(2))
        if dp.rank == 0:
            only_rank0.grad = torch.tensor([1.0, 2.0, 3.0])
        all_reduce_gradients([only_rank0, nowhere])

        try:
            Engine(config, base_model=model, out_dir=out, data_parallel=dp).open()
            refused = ""
        except CheckpointError as exc:
            refused = str(exc)

        torch.save(
            {
                "shares": dp.shares,
                "local": dp.local,
                "summed": dp.summed,
                "used": _grads(params),
                "adapter": adapter,
                "metrics": update.metrics,
                "version": update.version,
                "only_rank0": None if only_rank0.grad is None else only_rank0.grad.tolist(),
                "nowhere": nowhere.grad,
                "refused": refused,
            },
            result,
        )
    finally:
        dp.close()


if __name__ == "__main__":
    main(sys.argv[1:])
