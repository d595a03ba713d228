"""Collectors: where GPU usage enters Tally (NVML, dcgm-exporter, the simulated fleet), and the
producer that carries samples to Kafka.

    nvml             NvmlCollector: one sampling round of every local GPU (lifecycle, round,
                     samples, health)
    nvml_device      NvmlPort, NVML error translation, per-GPU state, MIG layout, energy
    nvml_processes   GPU processes, their SM utilisation and owners
    nvml_topology    each GPU's NVLink domain and NUMA node, as NVML tells them
    fake_nvml        FakeNvml: an NvmlPort for tests and benchmarks (topology calls:
                     fake_nvml_topology)
    ownership        process → owner: the rules that turn a host PID into an Owner
    dcgm             DcgmCollector: one dcgm-exporter, state across scrapes
    dcgm_http        DcgmConfig, fetch_metrics: the HTTP side
    dcgm_exposition  the Prometheus text format, problems and their dead letters
    dcgm_fields      families, units, label quirks (host, MIG profile, owner)
    dcgm_parse       parse_metrics: a payload as samples, XID health events and problems
    simulated        the simulated fleet
    runner           the collection loops: rounds on the sampling grid, packed and sent
    producer         SampleProducer: buffering, flushing, spooling and replay
    kafka            the aiokafka adapter (idempotence on tansu, error families)
    spool            the on-disk spool that keeps samples while the broker is away
    undeliverable    the record of messages the broker refused for their content
    metrics          the collector's own health as Prometheus metrics on /metrics
    errors           CollectorError ← NvmlUnavailableError, DcgmScrapeError, SpoolError, …
"""
