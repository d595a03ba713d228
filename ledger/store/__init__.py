"""The ledger store: the port (`port.LedgerStore`), its DuckDB + Parquet implementation
(`hot.DuckDBStore`, sealing in `sealing`, segment files and manifests in `segments`, side files
in `side_files`, row schemas in `schema`), the in-memory one (`memory.MemoryStore`), and the
tools that check and replay a data directory (`verify`, `rebuild`), and the sealed ledger on
an object store (the port and its adapters in `objects`; publishing and the readers' cache in
`replica`; the publishing writer in `published`; a sharded ledger read as one in `union`,
`union_rules` and `union_verify`)."""
