# Benchmark scripts and device jobs, run from the repository root: python -m benchmarks.<name>.
