"""Errors of the learner.

Exception
└── LearnerError              base of everything the learner raises on purpose
    ├── BatchError            a trajectory group that cannot become training samples
    │                         (missing token ids, logprobs that do not match, ...)
    ├── AdapterError          an adapter folder that must not be served: no manifest,
    │                         weights whose hash does not match, wrong base model
    ├── CheckpointError       a learner checkpoint that cannot be written or read
    ├── DemonstrationError    a demonstrations file that cannot be used for BC
    └── TrainingError         torch failed during an update (converted at one place,
                              `learner.trainer`, with `raise ... from exc`)
"""

from __future__ import annotations

__all__ = [
    "AdapterError",
    "BatchError",
    "CheckpointError",
    "DemonstrationError",
    "LearnerError",
    "TrainingError",
]


class LearnerError(Exception):
    """Base of the learner's own errors."""


class BatchError(LearnerError):
    """Trajectory groups that cannot become training samples."""


class AdapterError(LearnerError):
    """An adapter folder that is incomplete, corrupted or for another base model."""


class CheckpointError(LearnerError):
    """A learner checkpoint that cannot be written or read back."""


class DemonstrationError(LearnerError):
    """A demonstrations file that cannot be used for behaviour cloning."""


class TrainingError(LearnerError):
    """torch failed during an update or a BC step."""
