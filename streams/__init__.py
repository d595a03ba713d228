"""The stream processors: the Faust app, its topics and agents. Agents are thin: decode, call
`ledger`, emit."""
