"""Wire contracts: pydantic event and command models, the envelope, and the route table."""
