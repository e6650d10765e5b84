"""The learner: M-GRPO loss, batches, LoRA, behaviour cloning, the update loop.

- `Learner` (learner.trainer): groups in from a bounded stream, adapter versions out.
- `behaviour_clone` (learner.bc): the warm-up checkpoint RL starts from.
- `mgrpo_loss`, `group_advantages` (learner.loss): the objective, pure functions.
- `verify_adapter` (learner.lora): what may be published.

The names are loaded on first use, so `import learner.errors` (or `learner`) does not
import torch: the runtime can name the learner's errors without paying for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from learner.bc import BCReport, behaviour_clone
    from learner.errors import LearnerError
    from learner.lora import verify_adapter
    from learner.loss import group_advantages, mgrpo_loss
    from learner.trainer import Learner, LearnerStatistics

__all__ = [
    "BCReport",
    "Learner",
    "LearnerError",
    "LearnerStatistics",
    "behaviour_clone",
    "group_advantages",
    "mgrpo_loss",
    "verify_adapter",
]

_WHERE = {
    "BCReport": "learner.bc",
    "Learner": "learner.trainer",
    "LearnerError": "learner.errors",
    "LearnerStatistics": "learner.trainer",
    "behaviour_clone": "learner.bc",
    "group_advantages": "learner.loss",
    "mgrpo_loss": "learner.loss",
    "verify_adapter": "learner.lora",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'learner' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
