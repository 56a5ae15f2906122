"""The command-line tools and what only they use: ``ditfuse check`` (parity gates), ``bench``
(GPU benchmarks), ``inspect`` (sm_90 builds on the CPU), ``export`` (through ``ditfuse.aot``),
the shape registry, workloads and tiny models. Nothing in the library imports this package."""
