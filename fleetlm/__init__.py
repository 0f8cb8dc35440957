# The `fleetlm` command and service-wide glue. The rooms (engine/, kernels/, api/, workers/,
# metering/) are top-level packages of their own.
__version__ = "0.1.0"
