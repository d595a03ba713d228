"""Streamlit pages. Pages only: every number comes from `ledger.read.queries`."""
