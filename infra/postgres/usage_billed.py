"""Usage records billed under their billing system's record id (RecordUsage version 2): what a
batch loads to find repeats, and what it writes for the records it billed. One statement each,
whatever the batch's size; both run under the users' row locks (infra/postgres/batch_read.py, batch_write.py)."""

from __future__ import annotations

from infra.postgres.pruning import Rule

RETENTION = Rule("usage_billed", "telecom.usage_billed", "ctid", "keep_until < now()")
"""A billed record id is forgotten once its dedup window (PKGQ_USAGE_DEDUP_DAYS) has passed."""
