"""The outbox relay and the expiry sweep."""
