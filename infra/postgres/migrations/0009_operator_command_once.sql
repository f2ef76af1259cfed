-- pkgq 0009: an operator's cancel or quota adjustment is sent once per message_id.
-- The console's confirmation form carries the command's message_id, chosen when the form is
-- shown; a form posted twice (a double click, a resubmit) then inserts its audit row twice,
-- which this index refuses, and the second outbox row rolls back with it.
CREATE UNIQUE INDEX operator_actions_command_once ON telecom.operator_actions (message_id)
    WHERE action IN ('cancel', 'adjust_quota');
