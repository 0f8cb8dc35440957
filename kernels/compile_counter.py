# Counts Triton JIT compilations in this process. Every new specialization of a kernel (another
# constexpr tile size, another dtype, another pointer alignment) compiles once, on the thread that
# launches it: 0.1-2 s for an attention kernel on the H200's host, during which the GPU runs dry and
# every running request's next token waits. The engine compiles the variants it can reach at
# start-up (engine/runner/kernel_warmup.py); a compile after that is a stall in serving, so the step
# trace and the worker's metrics report them (fleetlm:kernel_compiles_total).
#
# Triton calls jit_cache_hook before it compiles a variant missing from its in-memory cache and
# jit_post_compile_hook after (a variant found in the on-disk cache goes through both, fast).
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class CompileCounts:
    count: int = 0  # compilations since the process started (or install())
    seconds: float = 0.0  # their total host time
    by_kernel: dict[str, int] = field(default_factory=dict)  # kernel name -> compilations


_lock = threading.Lock()
_counts = CompileCounts()
_started: dict[int, float] = {}  # thread id -> when its compile began
_installed = False


def install() -> bool:
    """Hook Triton's compiler (idempotent; hooks already set are kept and still called).
    False when Triton is not importable."""
    global _installed
    try:
        from triton import knobs
    except ImportError:
        return False
    with _lock:
        if _installed:
            return True
        before, after = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook

        def on_compile_start(*args, **kwargs):
            _started[threading.get_ident()] = time.perf_counter()
            # A truthy return skips the compile: only a hook that was there before may say so.
            return before(*args, **kwargs) if before is not None else None

        def on_compile_end(*args, **kwargs):
            began = _started.pop(threading.get_ident(), None)
            name = _kernel_name(kwargs.get("fn"))
            with _lock:
                _counts.count += 1
                if began is not None:
                    _counts.seconds += time.perf_counter() - began
                _counts.by_kernel[name] = _counts.by_kernel.get(name, 0) + 1
            return after(*args, **kwargs) if after is not None else None

        knobs.runtime.jit_cache_hook = on_compile_start
        knobs.runtime.jit_post_compile_hook = on_compile_end
        _installed = True
    return True


def count() -> int:
    """Compilations so far (cheap: read once per engine step)."""
    return _counts.count


def snapshot() -> CompileCounts:
    """A copy of the counts so far (zeros before install())."""
    with _lock:
        return CompileCounts(_counts.count, _counts.seconds, dict(_counts.by_kernel))


def _kernel_name(fn) -> str:
    name = getattr(fn, "name", None)
    return name if isinstance(name, str) else "?"
