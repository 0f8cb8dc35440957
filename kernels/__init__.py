# Triton kernels, each beside its pure-torch reference twin. The engine imports the kernels it
# needs; nothing here imports the engine or the service layers.
