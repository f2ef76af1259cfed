"""Adapters: settings, PostgreSQL, RabbitMQ and the outbox relay."""
