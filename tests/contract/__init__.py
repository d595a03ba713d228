"""Contract tests: one suite run against each implementation of a port (fake and real)."""
