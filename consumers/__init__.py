"""The composition root: one handler module per route, the runner and the CLI."""
