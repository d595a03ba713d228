"""The stream processors: the Faust app, its topics and agents (agents are thin: decode, call
`ledger`, emit), Kafka plumbing, and alert delivery from the alerts topic to webhooks
(`streams.alerts`). Imports `ledger` only, never `tally`."""
