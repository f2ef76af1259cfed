"""The package-queue model: states, items and pure transitions that return events.

No I/O, no asyncio, no pydantic: everything here is plain Python and runs in microseconds.
"""
