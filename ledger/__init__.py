"""Tally's domain core: events, units, accounts, postings, pricing, the store and its queries.

This package imports nothing else of the project; every other package speaks its vocabulary.
"""
