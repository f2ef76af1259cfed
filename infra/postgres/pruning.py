"""A table's retention rule: which of its rows are past retention. Each table's owning module
declares its own (`RETENTION`); infra/postgres/retention.py prunes by them in batches."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Rule:
    key: str
    """The name the rows are counted under in retention.prune()'s result."""
    table: str
    row_id: str
    """The column (or ctid) that identifies a row for the batched delete."""
    condition: str
    """`{cutoff}` stands for now() - retention."""
    returning: str = "1"
