"""Usage records billed under their billing system's record id (RecordUsage version 2): their
retention. A batch loads the ones its records name (infra/postgres/batch_read.py `load_billed`)
and writes the ones it billed (batch_write.py `bill_usages`), under the users' row locks."""

from __future__ import annotations

from infra.postgres.pruning import Rule

RETENTION = Rule("usage_billed", "telecom.usage_billed", "ctid", "keep_until < now()")
"""A billed record id is forgotten once its dedup window (PKGQ_USAGE_DEDUP_DAYS) has passed."""
