-- pkgq 0023: the console's sessions, kept on the server. The session cookie carries a random id
-- (32 bytes, consumers/web/sessions.py); this table holds only its sha256, so a copy of the
-- table opens no session. A session is valid while its row is here and neither its absolute
-- expiry nor PKGQ_WEB_SESSION_TTL (counted from `signed_in_at`) has passed: signing out
-- deletes the row, "sign out everywhere" deletes all of one user's, so a copied cookie is
-- refused from then on. `role` and `credential` (the sha256 of the user's password hash) are
-- what PKGQ_WEB_USERS said at sign-in: a session whose user has since been removed, or whose
-- role or password changed, is ended when it is next presented. Rows past `expires_at` are
-- pruned by retention (infra/postgres/retention.py), whatever PKGQ_RETENTION says.
-- Expand only: a new table; the previous release never reads it.
CREATE TABLE telecom.web_sessions (
    id_hash      bytea       PRIMARY KEY,
    user_name    text        NOT NULL,
    role         text        NOT NULL,
    credential   bytea       NOT NULL,
    signed_in_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);

-- "Sign out everywhere" finds a user's sessions; retention finds the expired ones.
CREATE INDEX web_sessions_user_name ON telecom.web_sessions (user_name);
CREATE INDEX web_sessions_expires_at ON telecom.web_sessions (expires_at);
