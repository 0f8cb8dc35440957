# The Triton compile counter (kernels/compile_counter.py) hooks the compiler without taking
# over hooks set before it, and never tells Triton to skip a compile. The CPU runs kernels in
# the interpreter (no compiles), so the hooks are called here as Triton calls them; the GPU
# test (tests/engine/test_gpu_paths.py) sees real compilations.
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_hooks_count_compiles_and_keep_earlier_hooks():
    # A fresh process: install() is once per process and other tests may have installed it.
    script = textwrap.dedent(
        """
        from types import SimpleNamespace
        from triton import knobs
        from kernels import compile_counter

        calls = []
        knobs.runtime.jit_cache_hook = lambda **kw: calls.append("start") or None
        knobs.runtime.jit_post_compile_hook = lambda **kw: calls.append("end")
        assert compile_counter.install() and compile_counter.install()  # idempotent
        fn = SimpleNamespace(name="_dense_prefill_kernel")
        for _ in range(2):
            assert knobs.runtime.jit_cache_hook(fn=fn, key=1) is None  # compile goes ahead
            knobs.runtime.jit_post_compile_hook(fn=fn, key=1)
        knobs.runtime.jit_cache_hook(fn=SimpleNamespace(name="_store_kv_kernel"))
        knobs.runtime.jit_post_compile_hook(fn=SimpleNamespace(name="_store_kv_kernel"))
        counts = compile_counter.snapshot()
        assert counts.count == compile_counter.count() == 3, counts
        assert counts.by_kernel == {"_dense_prefill_kernel": 2, "_store_kv_kernel": 1}
        assert counts.seconds >= 0.0
        assert calls == ["start", "end"] * 3, calls
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_skipping_earlier_hook_still_skips():
    script = textwrap.dedent(
        """
        from types import SimpleNamespace
        from triton import knobs
        from kernels import compile_counter

        knobs.runtime.jit_cache_hook = lambda **kw: True  # e.g. a tool that vets kernels
        compile_counter.install()
        assert knobs.runtime.jit_cache_hook(fn=SimpleNamespace(name="k")) is True
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
