"""bench/bc_step.py: the variants it is asked to time."""

from __future__ import annotations

import pytest

from bench.bc_step import Variant, parse_variants


def test_parse_variants_reads_budgets_and_compile() -> None:
    assert parse_variants("4096, 1024+compile") == [Variant(4096, False), Variant(1024, True)]
    assert Variant(1024, True).name == "1024 + compile"


@pytest.mark.parametrize("text", ["", "0", "1024+jit", "big", "1024,1024"])
def test_parse_variants_names_what_is_wrong(text: str) -> None:
    with pytest.raises(ValueError, match="variant"):
        parse_variants(text)
