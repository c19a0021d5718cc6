"""asv benchmarks of npufix: whole processes on the bench models (docs/benchmark.md says how to run them)."""
