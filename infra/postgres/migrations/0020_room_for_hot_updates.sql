-- pkgq 0020: room on each page of the three tables a usage batch updates row by row, so that
-- Postgres can write a row's new version beside the old one when no indexed column changed (a
-- HOT update: no index entry is written) instead of on another page (then every index of the
-- table gets a new entry, and package_queue has seven). Expand only: a storage parameter, set
-- under a SHARE UPDATE EXCLUSIVE lock, which blocks no reads or writes; the previous release
-- runs unchanged. That lock does wait for a VACUUM of the table (an anti-wraparound one is not
-- cancelled for it): `pkgq migrate` then waits too, while the application goes on.
--
-- Measured on the dev box (2026-11-27, docs/explanation/performance.md): with pages filled to
-- 100%, 52% of package_queue's updates were HOT in a scratch run of the delivery pipeline, 75%
-- of queue_users' and 70% of access'; at 80%, 94-95% of each. Postgres spent about 10% less
-- CPU per record of a usage backlog (42-44 -> 38-39 µs, 3 paired drains).
--
-- Pages written from now on keep a fifth free; existing pages gain room as their rows are
-- updated and pruned. A table rewritten later (VACUUM FULL, pg_repack) gets it everywhere.
ALTER TABLE telecom.package_queue SET (fillfactor = 80);
ALTER TABLE telecom.queue_users SET (fillfactor = 80);
ALTER TABLE telecom.access SET (fillfactor = 80);
