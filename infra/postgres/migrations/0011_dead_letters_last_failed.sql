-- pkgq 0011: dead letters filed or failed again in the last minute, per route (the overview's
-- and `pkgq stats`' failed /min, and every status port's refresh) read an index, not the table.
CREATE INDEX dead_letters_last_failed ON telecom.dead_letters (last_failed_at);
