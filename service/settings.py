# Service configuration: one pydantic-settings class read from the environment and `.env`.
# Every variable is FLEETLM_<FIELD> except the two connection URLs, which keep their usual names.
from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from engine.config import EngineConfig

# The small chat model that ships in the repository (models/, see docs/default-model.md); an
# installation without it falls back to the random-weight `tiny` preset.
_SHIPPED_MODEL = Path(__file__).resolve().parents[1] / "models" / "fleetlm-tiny-chat"
DEFAULT_MODEL = str(_SHIPPED_MODEL) if (_SHIPPED_MODEL / "config.json").exists() else "tiny"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="FLEETLM_", env_file=".env", extra="ignore", populate_by_name=True
    )

    # -- services --------------------------------------------------------------------------
    database_url: str | None = Field(
        None, validation_alias=AliasChoices("DATABASE_URL", "database_url")
    )
    redis_url: str | None = Field(None, validation_alias=AliasChoices("REDIS_URL", "redis_url"))
    data_dir: Path = Path(".fleetlm")  # embedded Redis/Postgres, demo key

    # -- model -----------------------------------------------------------------------------
    model: str = DEFAULT_MODEL  # HF checkpoint directory or preset name
    # The id clients send; default: the preset name or the checkpoint directory's name.
    served_model_name: str | None = None
    max_model_len: int | None = None  # None → the model's max_position_embeddings (KV-capped)

    # -- API -------------------------------------------------------------------------------
    host: str = "127.0.0.1"
    port: int = 8000
    # `fleetlm serve`'s API processes on the one port (docs/serving.md#api-processes); 0: one
    # per four cores, at most four. Each relays its own clients' streams.
    api_processes: int = Field(0, ge=0, le=64)
    max_queue_len: int = 1024  # per priority: requests queued or running before 503
    queue_retry_after_s: int = 1
    output_ttl_s: int = 300  # output streams expire this long after their last event
    # Per API process; with relay_mux off each open request holds one.
    redis_max_connections: int = 4096
    relay_poll_s: float = 0.5  # how often a waiting relay checks its worker's heartbeat
    # The API's one XREAD for all its output streams blocks this long (api/stream_mux.py): the
    # longest a new request's first event can wait for the read to include its stream.
    relay_mux_block_s: float = Field(0.005, gt=0)
    relay_mux: bool = True  # false: each relay blocks on its own stream (one XREAD per token)
    # An API process's event loop that does not run for this long is stalled: counted, and
    # logged at WARNING with where it was held (api/loop_watch.py). 0: no watching thread.
    api_stall_s: float = Field(1.0, ge=0)
    api_key_cache_s: float = 10.0  # how long a verified API key is trusted without a DB read
    limit_lease_s: float = 3600.0  # a concurrency slot not released by then frees itself
    # Hostile-input bounds (docs/operations.md#limits). A request body over max_request_bytes is
    # refused before parsing (None: 32 bytes per token of context, at least 1 MiB; uploads to
    # /v1/files are bounded by file_max_bytes instead).
    max_request_bytes: int | None = Field(None, gt=0)
    header_timeout_s: float = Field(10.0, gt=0)  # request line + headers, from connect/1st byte
    keep_alive_s: float = Field(75.0, gt=0)  # an idle kept-alive connection (past clients' 5 s)
    body_timeout_s: float = Field(30.0, gt=0)  # a whole request body, from its headers
    upload_timeout_s: float = Field(600.0, gt=0)  # ... of an upload to /v1/files
    max_stop_chars: int = Field(1024, ge=1)  # each stop string (at most 4, as OpenAI's)
    max_n: int = Field(16, ge=1)  # choices per request (`n`); they share the prompt's KV blocks
    # A second listener that serves only GET /metrics, without a key, for the scraper (0: off;
    # the API port's /metrics always needs an admin key).
    metrics_port: int = Field(0, ge=0, le=65535)

    # -- metering --------------------------------------------------------------------------
    metering_batch_size: int = 500  # records per INSERT / transaction
    metering_claim_idle_s: float = 30.0  # a writer's pending records idle this long are taken
    metering_retain_s: float = 3600.0  # acknowledged records stay on the stream this long
    metering_retry_s: float = 1.0  # back-off while Postgres is unreachable
    busy_interval_s: int = 60  # workers report busy time per interval of this length

    # -- workers ---------------------------------------------------------------------------
    heartbeat_interval_s: float = 1.0
    worker_dead_after_s: float = 8.0  # heartbeat TTL: a silent worker counts as dead after it
    no_worker_timeout_s: float = 5.0  # a queued request fails after this long with no live worker
    worker_max_waiting: int = 8  # queue entries held in the engine's waiting queue
    # A worker takes from the queues only what its engine can start and still serve at this
    # time per output token (its running set's predicted decode turn, workers/gpu/intake_budget.py)
    # with kv_headroom of its KV pool kept free for the running requests' growth.
    tpot_target_s: float = Field(0.04, gt=0)
    kv_headroom: float = Field(0.1, ge=0, lt=1)
    # ... and this many entries beyond that, held in the engine's waiting queue until a seat
    # frees (0: none; what waits stays in Redis, where other workers and admission see it).
    worker_max_held: int = Field(0, ge=0)
    batch_min_free_kv: float = 0.25  # read batch work only with this fraction of KV free
    batch_max_waiting: int = 2  # ... and at most this many requests waiting in the engine
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    block_size: int = 16
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.90
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 4096  # engine/config.py says why
    enable_prefix_caching: bool = True
    # Speculative decoding (docs/speculative.md): "ngram" or "draft" (with draft_model).
    speculative_method: Literal["ngram", "draft"] | None = None
    num_speculative_tokens: int = 4
    draft_model: str | None = None
    # FP8 and tensor parallelism (docs/serving.md#fp8-and-tensor-parallelism): e4m3 weights,
    # an e4m3 KV cache, and workers that are groups of this many GPUs (one process per GPU,
    # rank 0 speaks to Redis).
    quantization: Literal["fp8"] | None = None
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    tensor_parallel_size: int = Field(1, ge=1)
    use_piecewise_graphs: bool = True  # CUDA graph pieces for steps with prompt chunks
    piecewise_max_tokens: int = 2560
    piecewise_bucket_step: int = Field(128, ge=0)  # 0: power-of-two buckets (engine/config.py)
    # Latency-aware prefill (docs/serving.md): steps with decodes keep their predicted time under
    # this target (None: off, each step may fill max_num_batched_tokens with prefill).
    step_time_target_s: float | None = None
    # Without a target: short prompts keep whole steps, documents their share (engine/config.py)
    pace_long_prompts: bool = False
    prefill_split_keys: bool = False  # split the prefill attention's keys over idle SMs
    calibrate_step_costs: bool = True  # with a target or paced documents: time chosen steps
    prefill_ttft_guard_s: float = 0.0
    ttft_prompt_tokens: int = 4000
    ttft_target_s: float = Field(0.8, gt=0)  # with a target: when a short prompt's token is due
    long_prompt_share: float = Field(0.25, gt=0, lt=1)  # the documents' share beside decodes
    short_prefill_first: bool = (
        True  # short prompts' chunks before long ones' (engine/core/prefill_order.py)
    )
    long_prefill_chunk: int = Field(2048, ge=0)  # a long prompt's chunk beside others (0: no cap)
    # Overlapped scheduling (docs/serving.md#overlapped-scheduling): step N+1 launches before
    # step N's tokens reach the host. None: on for a GPU worker without speculative decoding or
    # tensor parallelism (engine/config.py).
    overlap_scheduling: bool | None = None
    # Shared-prefix decode attention (docs/serving.md#shared-prefix-decode-attention): a prefix
    # that running rows share is read once per group of rows a decode step, not once per row.
    shared_prefix_decode: bool = False
    shared_prefix_min_tokens: int = Field(256, ge=1)
    # Compiled grammars a worker keeps, by spec (docs/serving.md#structured-outputs).
    grammar_cache_size: int = Field(256, ge=1)
    # How `tool_choice: auto` answers are read (docs/serving.md#tool-calls): "hermes"
    # (<tool_call> tags, Qwen), "llama3_json", or "auto": from the chat template.
    tool_call_parser: Literal["auto", "hermes", "llama3_json"] = "auto"
    # Intra-op threads: None → 1 for a GPU worker; for a CPU worker the cores but one, split
    # among the CPU workers of the machine (workers/gpu/torch_threads.py).
    torch_threads: int | None = None
    # Run the step's Redis round trip while the next step runs on the GPU (docs/serving.md).
    worker_overlap_exchange: bool = True
    # ... and wait for Redis on a thread of its own while the finished step's tokens are
    # processed (graph-replayed steps; workers/gpu/worker.py)
    worker_exchange_thread: bool = True
    # While a step runs on the GPU, read the queues again this often (0: once per step), so a
    # request arriving during a long prefill step is admitted right after it.
    worker_poll_s: float = 0.002
    worker_step_trace_dir: Path | None = None  # append per-step timing rows here (benchmarks)
    # Rehearsals and tests only: every step also waits fixed + per decode row + per prompt token
    # seconds (JSON, e.g. [0.03, 0.002, 0.001]), giving a CPU worker a big model's shape (a
    # long prefill, a decode step that grows with the batch). None: off.
    emulate_step_cost_s: tuple[float, float, float] | None = None
    # /reset_prefix_cache, /start_profile, /stop_profile wait this long for every live worker
    control_timeout_s: float = 20.0
    profile_dir: Path | None = None  # /stop_profile's traces; None → <data_dir>/profiles
    profile_max_steps: int = 100  # a profile records at most this many engine steps

    # -- routing (docs/serving.md#routing) -------------------------------------------------
    # Send each request to the worker whose prefix cache holds the longest part of its prompt,
    # weighed against load (False: every request on the shared queues, any worker takes it).
    routing: bool = True
    routing_max_blocks: int = Field(256, ge=1)  # leading blocks of a prompt routing compares
    routing_max_published_blocks: int = Field(65536, ge=0)  # hashes a worker keeps in Redis
    # Cost of a block of prefill (the uncached prompt, and the prefill queued ahead) against a
    # KV block in use by running requests; higher favours cache hits over balance.
    routing_prefill_weight: float = Field(2.0, ge=0)
    # A worker takes from other live workers' queues when its engine has at most this many
    # requests waiting (-1: never; a dead or draining worker's queue is always drained).
    steal_max_waiting: int = Field(0, ge=-1)
    steal_min_age_s: float = Field(0.25, ge=0)  # ... entries that have waited there this long

    # -- operations (docs/operations.md) ---------------------------------------------------
    worker_metrics_port: int = 0  # a worker's own /metrics port (0: off; `serve` adds the index)
    metrics_snapshot_s: float = 1.0  # how often a worker ships its series to Redis for the API
    drain_timeout_s: float = 30.0  # SIGTERM: in-flight work gets this long to finish
    drain_delay_s: float = 0.0  # API: keep answering 503 this long so load balancers notice
    log_format: Literal["text", "json"] = "text"
    log_level: str = "INFO"

    # -- faults and overload (docs/operations.md#faults-and-overload) ------------------------
    redis_timeout_s: float = 5.0  # connect and reply timeout of every Redis client
    redis_outage_s: float = 30.0  # streams and workers ride out an unreachable Redis this long
    unavailable_retry_after_s: int = 2  # Retry-After of a 503 while Redis or Postgres is away
    database_timeout_s: float = 2.0  # API: a key lookup waits this long for Postgres
    api_key_stale_s: float = 3600.0  # a verified key keeps working this long while Postgres is away
    sse_keepalive_s: float = 2.0  # an SSE comment after this long without an event
    # An API process rewrites the lease of every request it relays this often; a lease not
    # rewritten for api_lease_ttl_s (the process died) stops its request, billed what the
    # lease last said the client was sent (docs/operations.md#api-process-death).
    api_lease_refresh_s: float = Field(0.5, gt=0)
    api_lease_ttl_s: float = Field(3.0, gt=0)
    # Admission (api/load_shedding.py): interactive is refused (503) when its predicted time to
    # first token is longer; flex (batch priority) has its own, longer bound.
    max_queue_wait_s: float = 10.0
    batch_max_queue_wait_s: float = 30.0
    load_refresh_s: float = 0.5  # how often an API process re-reads the queues' load

    # -- batches (docs/batches.md) ---------------------------------------------------------
    file_max_bytes: int = 200 * 1024 * 1024  # one uploaded file
    batch_max_lines: int = 50_000  # requests in one batch input file
    batch_completion_windows: list[str] = ["24h"]  # accepted completion_window values
    batch_max_inflight: int = 64  # lines of one batch on the batch stream or running at once
    batch_pump_interval_s: float = 0.5  # a batch's pump re-runs this often while it is active
    batch_stale_s: float = 15.0  # a pump silent this long is re-armed by the beat sweep
    batch_sweep_s: float = 5.0  # beat: sweep (re-arm, expire) this often
    batch_output_ttl_s: int = 7 * 24 * 3600  # batch lines' output streams (the pump deletes them)
    celery_visibility_timeout_s: int = 60  # an unacked task is redelivered after this long

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        path = Path(self.model)
        return path.name if (path / "config.json").exists() else self.model

    def resolved_max_model_len(self) -> int:
        """The context both the API (admission) and the workers (engine) enforce."""
        from engine.models.config import resolve_model_config  # torch-free

        limit = resolve_model_config(self.model).max_position_embeddings
        if self.max_model_len is not None:
            limit = min(limit, self.max_model_len)
        if self.num_kv_blocks is not None:
            limit = min(limit, self.num_kv_blocks * self.block_size)
        return limit

    def resolved_max_request_bytes(self) -> int:
        if self.max_request_bytes is not None:
            return self.max_request_bytes
        return max(1024 * 1024, 32 * self.resolved_max_model_len())

    def vocab_size(self) -> int:
        from engine.models.config import resolve_model_config  # torch-free

        return resolve_model_config(self.model).vocab_size

    def engine_config(self) -> EngineConfig:
        """A worker's engine: every EngineConfig knob these settings name (FLEETLM_<knob>),
        with the context the API admits against."""
        from engine.config import EngineConfig  # torch-free

        knobs = {f.name for f in fields(EngineConfig)} & set(type(self).model_fields)
        values = {name: getattr(self, name) for name in knobs}
        return EngineConfig(**values | {"max_model_len": self.resolved_max_model_len()})

    @property
    def liveness_bound_s(self) -> float:
        """Worst case from a worker's death to its client's error event (docs/serving.md)."""
        return self.worker_dead_after_s + self.no_worker_timeout_s + self.relay_poll_s
