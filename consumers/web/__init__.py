"""`pkgq web`: the operator console and the read API for node management, one ASGI process.

- config.py: its settings (PKGQ_WEB_*): bind address, users, API tokens, session secret;
- auth.py: password hashes, sessions, bearer tokens, roles and CSRF;
- app.py: the application factory (one long-lived pool per process);
- api.py: the JSON read API (/api/v1) and the probes;
- pages.py, dlq_pages.py: the console's pages and actions;
- command.py: the `pkgq web` command group.
"""
