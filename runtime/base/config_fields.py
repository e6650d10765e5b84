"""The building blocks of every config section (runtime.base.config): the frozen,
keyword-only base that rejects unknown fields, and the constrained number types whose
bounds a bad file is checked against.

Like the rest of the floor it imports nothing of the project.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

__all__ = [
    "Allocator",
    "Fraction",
    "NonNegative",
    "NonNegativeFloat",
    "Port",
    "Positive",
    "PositiveFloat",
    "Section",
]

Positive = Annotated[int, msgspec.Meta(ge=1)]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]


# policy.allocator's choices (policy/allocator.py)
Allocator = Literal["auto", "tcmalloc", "system"]


class Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every config section: frozen, keyword-only, unknown fields rejected."""
