# Benchmark harnesses shared by `fleetlm bench` and benchmarks/gpu_suite.py.
