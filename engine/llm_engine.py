# The streaming engine the worker drives: add_request / step / abort / stats. Each step
# schedules, runs one forward pass, samples, detokenizes and returns one delta per request that
# produced tokens or finished. With overlap_scheduling (engine/runner/overlap.py) a step is launched
# before the previous one's tokens are on the host, and its tokens come back one step later.
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.core.block_manager import BlockManager
from engine.core.request import Priority, Request, RequestStatus
from engine.core.request_group import RequestGroup, copy_id, copy_params
from engine.core.request_intake import new_request
from engine.core.scheduler import SchedulerOutput, build_scheduler
from engine.core.step_outputs import flush_text, new_tokens_delta, request_delta
from engine.models.config import resolve_model_config
from engine.outputs import EngineStats, RequestDelta
from engine.parallel.tp_followers import start_tensor_parallel
from engine.runner.overlap import OverlapSteps, Unsynced
from engine.runner.runner_setup import build_runner, resolve_device, resolve_dtype
from engine.runner.step_calibration import calibrate_step_costs
from engine.runner.step_trace import StepTrace
from engine.sampling.sampler import HostCopy
from engine.sampling_params import SamplingParams
from engine.spec.ngram import NgramProposer
from engine.spec.policy import Speculator
from engine.tokenizer import Tokenizer
from kernels import compile_counter


@dataclass(slots=True)
class StepInFlight:
    """A step between begin_step() and finish_step()."""

    deltas: list[RequestDelta]  # deltas already due (aborts since the last step)
    started_at: float  # time.time() at begin_step
    t0: float  # perf_counter at begin_step
    out: SchedulerOutput | None = None
    num_before: dict[str, int] = field(default_factory=dict)
    launched: HostCopy | None = None
    graphed: bool = False  # launching it replays a CUDA graph
    host_s: float = 0.0  # the engine's own time in schedule_step + launch_step
    finish_s: float = 0.0  # in finish_step
    # Overlapped scheduling: the step whose sampled ids this one reads on the device (committed
    # when this one finishes), and this step's requests that sample, in row order.
    feeds_from: Unsynced | None = None
    sample_rows: list[Request] = field(default_factory=list)


class LLMEngine:
    def __init__(self, config: EngineConfig, tokenizer: Tokenizer | None = None) -> None:
        self.config = config
        self.model_config = resolve_model_config(config.model)
        self.device = resolve_device(config.device, 0, config.tensor_parallel_size)
        self.dtype = resolve_dtype(config.dtype, self.model_config.dtype, self.device)
        self.tokenizer = tokenizer if tokenizer is not None else Tokenizer.for_model(config.model)
        eos = tuple(
            dict.fromkeys(self.model_config.eos_token_ids + tuple(self.tokenizer.eos_token_ids))
        )
        self.eos_token_ids = eos

        # Tensor parallel: this process is rank 0; the other ranks start here and follow.
        self.tp, self._followers = start_tensor_parallel(config, self.device)
        try:
            self.runner = build_runner(config, self.model_config, self.device, self.dtype, self.tp)
        except BaseException:
            self.shutdown()
            raise
        self.runner.eos_token_ids = eos
        compile_counter.install()
        self._compiles_at_ready = self._compiles_seen = compile_counter.count()
        num_blocks = self.runner.num_blocks
        self.max_model_len = self.runner.max_model_len
        self.block_manager = BlockManager(
            num_blocks, config.block_size, config.enable_prefix_caching
        )
        self.scheduler = build_scheduler(config, self.block_manager, eos)
        self.prefill_policy = self.scheduler.prefill_policy
        self.calibration_report: dict | None = None
        if self.prefill_policy is not None and config.calibrate_step_costs:
            try:
                self.calibration_report = calibrate_step_costs(
                    self.runner, self.prefill_policy.model
                )
            except Exception as e:  # an aid, not a need: the model still fits online (the
                # worker logs this report, the error included)
                self.calibration_report = {"error": f"{type(e).__name__}: {e}"}
        self.speculator: Speculator | None = None
        if config.speculative_method == "ngram":
            proposer = NgramProposer(config.ngram_min, config.ngram_max)
            self.speculator = Speculator(config, proposer)
        elif config.speculative_method == "draft":
            self.speculator = Speculator(config, self.runner.draft)
        self._pending: list[RequestDelta] = []  # aborted since the last step
        # Constrained decoding: grammars compile on a thread of their own, so a new schema never
        # holds up the step loop; its request joins the scheduler once its matcher is ready.
        self._grammars = None  # engine.grammar.GrammarCompiler, made by the first use
        self._eos_for_grammars = eos
        self._grammar_pool: ThreadPoolExecutor | None = None
        self._compiling: dict[str, tuple[Future, Request]] = {}
        self._groups: dict[str, RequestGroup] = {}  # unfinished n > 1 requests by caller id
        self.last_schedule_s = 0.0
        self.last_sync_s = 0.0  # of it, waiting for the GPU at a sync step
        self.step_trace: StepTrace | None = None  # enable_step_trace() turns recording on
        self.last_step_row = -1  # the trace row of the last step (the worker adds its times)
        self._in_flight = False  # between begin_step and finish_step
        self.overlap: OverlapSteps | None = None
        overlap = config.overlap_scheduling
        if overlap is None:
            overlap = (
                self.runner.device.type == "cuda"
                and config.speculative_method is None
                and config.tensor_parallel_size == 1
            )
        if overlap:
            self.overlap = OverlapSteps(self.scheduler, self.runner)

    def shutdown(self) -> None:
        """Stop the tensor-parallel followers (nothing to do with one rank); idempotent."""
        pool, self._grammar_pool = getattr(self, "_grammar_pool", None), None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        followers, self._followers = self._followers, None
        if followers is None:
            return
        if getattr(self, "runner", None) is not None:
            followers.stop(release=self.runner.stop_followers)
        else:  # the group never finished starting
            followers.kill()
        self.tp.close()

    def set_overlap_scheduling(self, enabled: bool) -> None:
        """Switch overlapped scheduling on or off between workloads (benchmarks compare both
        on one engine); the config's own checks apply."""
        if self.has_unfinished() or self._in_flight:
            raise RuntimeError("switch overlapped scheduling only while the engine is idle")
        self.config = dataclasses.replace(self.config, overlap_scheduling=enabled)
        self.overlap = OverlapSteps(self.scheduler, self.runner) if enabled else None

    def enable_step_trace(
        self, capacity: int = 1 << 18, extra_fields: tuple[str, ...] = ()
    ) -> StepTrace:
        """Record every step (engine/runner/step_trace.py); on CUDA also its GPU interval."""
        self.step_trace = StepTrace(capacity, extra_fields)
        if self.device.type == "cuda":
            self.runner.step_events = []
        return self.step_trace

    def disable_step_trace(self) -> None:
        self.step_trace = None
        self.runner.step_events = None

    # -- requests ------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        priority: Priority | str = Priority.INTERACTIVE,
        arrival_time: float | None = None,
        cache_salt: object = None,
        output_token_ids: Sequence[int] = (),
    ) -> None:
        """`output_token_ids`: resume a request another engine started, from the output tokens
        it had produced; they are recomputed like a preempted request's (prefix-cached where
        possible), count as output (max_tokens, min_tokens, usage) and are not emitted again."""
        self._check_no_step_in_flight()
        params = params or SamplingParams()
        if params.prompt_logprobs is not None and self.tp.size > 1:
            raise ValueError("prompt_logprobs is not supported with tensor parallelism")
        if request_id in self._groups:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        if params.n > 1 and output_token_ids:
            raise ValueError("a request with n > 1 cannot resume from output tokens")

        def make(rid: str, sampling: SamplingParams) -> Request:
            return new_request(
                rid, prompt_token_ids, sampling, Priority.parse(priority), arrival_time,
                cache_salt, output_token_ids, vocab_size=self.model_config.vocab_size,
                max_model_len=self.max_model_len, tokenizer=self.tokenizer,
            )  # fmt: skip

        if params.n == 1:
            self._enqueue(make(request_id, params))
            return
        # n copies: all checked before any is queued; copy 0 first, so it is admitted first.
        copies = [make(copy_id(request_id, i), copy_params(params, i)) for i in range(params.n)]
        self._groups[request_id] = RequestGroup(request_id, copies)
        for request in copies:
            self._enqueue(request)

    def _enqueue(self, request: Request) -> None:
        """Into the scheduler, or first to the grammar thread when it is constrained."""
        spec = request.params.structured_output
        if spec is None:
            self.scheduler.add_request(request)
            return
        if self._grammar_pool is None:
            self._grammar_pool = ThreadPoolExecutor(1, thread_name_prefix="grammar")
        self._compiling[request.request_id] = (
            self._grammar_pool.submit(self.grammars.matcher, spec),
            request,
        )

    def _admit_compiled(self) -> None:
        """Constrained requests whose grammar is ready join the scheduler; one whose grammar
        failed to compile ends as an error (the API checks grammars first: rare here)."""
        from engine.sampling.grammar_mask import GrammarMasks, GrammarState

        for request_id, (future, request) in list(self._compiling.items()):
            if not future.done():
                continue
            del self._compiling[request_id]
            try:
                request.grammar = GrammarState(future.result())
            except ValueError as exc:
                request.status = RequestStatus.FINISHED
                request.finish_reason, request.error = "error", str(exc)
                request.finish_time = time.time()
                self._pending.append(request_delta(request, [], ""))
                continue
            if self.runner.grammar_masks is None:
                self.runner.grammar_masks = GrammarMasks(
                    self.grammars.tokenizer.vocab_size, self.device, self.eos_token_ids
                )
            self.scheduler.add_request(request)

    @property
    def grammars(self):
        """The engine's grammar compiler (engine.grammar.GrammarCompiler). Imported on first
        use: llguidance is needed only once a constrained request comes, so an engine without
        it (a bare GPU image) serves everything else."""
        if self._grammars is None:
            from engine.grammar import GrammarCompiler

            self._grammars = GrammarCompiler(
                self.tokenizer, self.model_config.vocab_size, self._eos_for_grammars,
                self.config.grammar_cache_size,
            )  # fmt: skip
        return self._grammars

    def abort(self, request_id: str) -> bool:
        """Frees the request's KV blocks now; its final delta comes with the next step."""
        self._check_no_step_in_flight()
        group = self._groups.get(request_id)
        if group is not None:  # every copy still running (their last one ends the request)
            aborted = [self._abort_one(r.request_id) for r in group.members]
            return any(aborted)
        return self._abort_one(request_id)

    def _abort_one(self, request_id: str) -> bool:
        request = self.scheduler.requests.get(request_id)
        if request is None:
            compiling = self._compiling.pop(request_id, None)
            if compiling is None:
                return False
            request = compiling[1]  # never scheduled: nothing to free
            request.status, request.finish_reason = RequestStatus.FINISHED, "abort"
            self._pending.append(request_delta(request, [], ""))
            return True
        if self.overlap is not None:
            self.overlap.before_abort(request)
        self.scheduler.finish(request, "abort")
        self._pending.append(request_delta(request, [], flush_text(request)))
        return True

    def _check_no_step_in_flight(self) -> None:
        if self._in_flight:
            raise RuntimeError("the engine is between begin_step() and finish_step()")

    def has_unfinished(self) -> bool:
        # (An overlapped step's live requests are the scheduler's: no separate check needed.)
        return self.scheduler.has_unfinished() or bool(self._pending) or bool(self._compiling)

    # -- the step ------------------------------------------------------------------------

    def step(self) -> list[RequestDelta]:
        return self.finish_step(self.begin_step())

    def begin_step(self) -> StepInFlight:
        """Schedule the next step and launch its device work without waiting for it. Until
        finish_step(), the engine must not be changed (no add_request or abort): the caller
        may only do unrelated host work, which then overlaps the GPU's."""
        return self.launch_step(self.schedule_step())

    def schedule_step(self) -> StepInFlight:
        """The first half of begin_step: decide the step (and draft, when speculating). Its
        `graphed` says whether launching it will be cheap (a graph replay)."""
        self._check_no_step_in_flight()
        if self._compiling:
            self._admit_compiled()
        deltas, self._pending = self._pending, []
        step = StepInFlight(deltas=deltas, started_at=time.time(), t0=time.perf_counter())
        overlap = self.overlap
        self.last_sync_s = 0.0
        if overlap is not None:
            if overlap.needs_sync():
                deltas += overlap.sync()  # waits for the GPU: see overlap.py, sync steps
                self.last_sync_s = time.perf_counter() - step.t0
            step.feeds_from = overlap.take_unsynced()
        spec = self.speculator
        drafting = spec is not None and spec.plan(self.scheduler.running)
        out = self.scheduler.schedule()
        if overlap is not None:
            for request in out.failed:  # failed now: its pending token is not emitted
                overlap.before_abort(request)
        if drafting and not out.is_empty:
            self.runner.begin_step()
            spec.propose(out)
            self.scheduler.apply_drafts(out)
        self.last_schedule_s = time.perf_counter() - step.t0  # includes drafting, when on
        step.out = out
        if overlap is None:  # (overlapped, a commit knows each new token's index)
            step.num_before = {r.request_id: r.num_tokens for r in out.requests}
        step.graphed = self.runner.will_replay(out)
        step.host_s = self.last_schedule_s
        self._in_flight = True
        return step

    def launch_step(self, step: StepInFlight) -> StepInFlight:
        """The second half of begin_step: queue the step's device work."""
        t0 = time.perf_counter()
        out = step.out
        if out.is_empty:
            step.launched = None
        elif self.overlap is None:
            step.launched = self.runner.launch(out)
        else:
            step.sample_rows = self.overlap.sampling_rows(out)
            prev = step.feeds_from
            feed = (prev.feed_rows(), prev.launched.device_values) if prev else (None, None)
            read_ahead = None
            if OverlapSteps.has_grammar_rows(prev):
                read_ahead = lambda: OverlapSteps.read_grammar_tokens(prev)  # noqa: E731
            step.launched = self.runner.launch(out, *feed, before_masks=read_ahead)
        step.host_s += time.perf_counter() - t0
        return step

    @staticmethod
    def step_time(step: StepInFlight) -> float:
        """The engine's own time in a finished step (what the trace records as wall_s)."""
        return step.host_s + step.finish_s

    def step_done(self, step: StepInFlight) -> bool:
        """True once finish_step(step) would not wait for the device."""
        if self.overlap is not None:  # it waits for the step it feeds from, not for its own
            return step.feeds_from is None or step.feeds_from.launched.done()
        return step.launched is None or step.launched.done()

    def finish_step(self, step: StepInFlight) -> list[RequestDelta]:
        """Wait for the step begin_step() launched; returns its deltas. With overlapped
        scheduling: wait for the step before it instead, and return that one's deltas (this
        step's come with the next finish_step)."""
        t_wait = time.perf_counter()
        out, deltas = step.out, step.deltas
        if self.overlap is not None:
            if step.feeds_from is not None:
                deltas += self.overlap.commit(step.feeds_from)
            self._in_flight = False
            t_post = t_wait + self.runner.timing.wait_s  # commit() collected (or 0: launch)
            self.overlap.advance(out, step.sample_rows, step.launched)
        else:
            sampled = self.runner.collect(step.launched) if step.launched is not None else []
            self._in_flight = False
            t_post = time.perf_counter()
            for request in self.scheduler.update_from_output(out, sampled):
                start = step.num_before[request.request_id]
                deltas.append(new_tokens_delta(self.scheduler, request, start))
        for request in out.failed:
            deltas.append(request_delta(request, [], flush_text(request)))
        for delta in deltas:
            for lp in (delta.logprobs or []) + (delta.prompt_logprobs or []):
                lp.decode(self.tokenizer)
            if delta.finish_reasons is not None:  # an n > 1 request's end
                self._groups.pop(delta.request_id, None)
        step.finish_s = time.perf_counter() - t_wait
        self._observe_step_time(step)
        if self.step_trace is not None and not out.is_empty:
            self._trace_step(step, t_wait, t_post)
        return deltas

    def _observe_step_time(self, step: StepInFlight) -> None:
        policy = self.prefill_policy
        if policy is None:
            return
        if self.overlap is None:
            if not step.out.is_empty:
                policy.observe(step.out.features, step.host_s + step.finish_s)
        elif step.feeds_from is not None:
            # Overlapped, the engine's time from one finish to the next is the time the GPU
            # took for the step it waited for (when the GPU is the bottleneck).
            policy.observe(step.feeds_from.features, step.host_s + step.finish_s)

    def _trace_step(self, step: StepInFlight, t_wait: float, t_post: float) -> None:
        now = time.perf_counter()
        timing = self.runner.timing
        bm = self.block_manager
        out = step.out
        compiles = compile_counter.count()
        # wall_s counts the engine's own time: launch + wait + post, not what the caller did
        # between begin_step and finish_step.
        row = self.step_trace.record(
            start=step.started_at, wall_s=step.host_s + (now - t_wait),
            schedule_s=self.last_schedule_s, sync_s=self.last_sync_s, prepare_s=timing.prepare_s,
            forward_s=timing.forward_s, sample_s=timing.sample_s, wait_s=timing.wait_s,
            read_ahead_s=timing.read_ahead_s, masks_s=timing.masks_s,
            post_s=now - t_post, host_s=step.host_s, num_tokens=sum(out.num_new_tokens),
            num_decodes=out.num_decodes, num_seqs=len(out.requests),
            num_running=len(self.scheduler.running), num_waiting=self.scheduler.num_waiting,
            kv_usage=bm.usage, overlapped=float(step.feeds_from is not None),
            kernel_compiles=compiles - self._compiles_seen,
            decode_context=out.features.decode_context if out.features else math.nan,
            prefill_pairs=out.features.prefill_pairs if out.features else math.nan,
        )  # fmt: skip
        self._compiles_seen = compiles
        self.last_step_row = row
        events = self.runner.step_events
        if events:
            start, end = events.pop()
            events.clear()
            self.step_trace.attach_gpu_events(row, start, end)

    def reset_prefix_cache(self) -> int:
        """Forgets every cached prefix block that no request holds; returns how many."""
        return self.block_manager.reset_prefix_cache()

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=self.scheduler.num_waiting,
            num_free_blocks=bm.num_free_blocks,
            num_total_blocks=bm.num_blocks,
            kv_cache_usage=bm.usage,
            prefix_cache_queries=bm.prefix_cache_queries,
            prefix_cache_hits=bm.prefix_cache_hits,
            num_preemptions=self.scheduler.num_preemptions,
            num_waiting_tokens=sum(
                r.num_tokens for queue in self.scheduler.waiting.values() for r in queue
            ),
            spec_decode_num_draft_tokens=self.scheduler.num_spec_draft_tokens,
            spec_decode_num_accepted_tokens=self.scheduler.num_spec_accepted_tokens,
            kernel_compiles=compile_counter.count() - self._compiles_at_ready,
        )
