"""One module per route; `registry.HANDLERS` maps each route to its handler."""
