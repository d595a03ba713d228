"""The composition root: configuration, the `tally` CLI, and the embedded stack supervisor."""
