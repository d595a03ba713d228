"""Collectors: where GPU usage enters Tally (NVML, dcgm-exporter, the simulated fleet), and the
producer that carries samples to Kafka."""
