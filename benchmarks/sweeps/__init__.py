# Kernel configuration sweeps and their helpers: python -m benchmarks.sweeps.<name>.
