"""The learner: M-GRPO loss, batches, LoRA, behaviour cloning, the update loop."""

__all__: list[str] = []
