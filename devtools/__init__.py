"""Developer tools: the benchmark and the demo. Not part of what runs in production (the
image leaves this package out); the `pkgq` CLI registers their commands when it is present."""
