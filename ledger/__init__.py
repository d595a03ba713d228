"""Tally's domain core. The modules at this level are the pure rules: units, accounts, periods,
postings, pricing, the event envelope and every event family, admin events, job events, holds,
GPU assignments, attribution, idle detection, alerts, balances, closing, dedupe scopes. They
take values and return values; nothing here touches files, DuckDB or Kafka.

Three subpackages build on them: `ingest` (the write path: view → pure fold → validate →
commit, through the store port), `store` (the port, its DuckDB + Parquet and in-memory
implementations, verify and rebuild) and `read` (read models over the sealed segments).

This package imports nothing else of the project; every other package speaks its vocabulary.
"""
