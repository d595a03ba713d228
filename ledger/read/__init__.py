"""Read models over the sealed ledger: queries, rollups, reports, statements, FOCUS exports and
job history. Readers open their own DuckDB connection over the Parquet segments and never the
writer's database."""
