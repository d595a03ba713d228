"""Benchmarks (`make bench`), not tests: each figure is printed beside a baseline measured in the
same run. Every `bench_*.py` module here defines `run(progress) -> list[Figure]`."""
