# Kernel tests run on the GPU when there is one, else in Triton's CPU interpreter.
# This must happen before anything imports triton's kernels: @triton.jit decides when a kernel is
# decorated (i.e. when a kernels.* module is imported) whether it becomes an interpreted function.
# `import torch` does not import triton. tests/conftest.py does the same for the whole suite and
# the Makefile exports TRITON_INTERPRET=1 for `make test`; this file keeps
# `pytest tests/kernels` self-sufficient.
import importlib
import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _reload_kernels_built_before_interpret() -> None:
    """If another test directory imported kernels.* before this file set TRITON_INTERPRET (a
    plain `pytest` run collects tests/engine first), re-import them so their @triton.jit
    functions are interpreted ones. A no-op under `make test` or on a GPU."""
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        return
    from triton.runtime.jit import JITFunction

    for name in sorted(sys.modules):
        mod = sys.modules[name]
        if name.split(".")[0] != "kernels" or mod is None:
            continue
        if any(isinstance(v, JITFunction) for v in vars(mod).values()):
            importlib.reload(mod)


_reload_kernels_built_before_interpret()


@pytest.fixture(params=["keys", "blocks", "blocks_t", "blocks_ts"])
def decode_walk(request, monkeypatch):
    """paged_decode_attention's split kernel walking its keys each way (kernels/
    paged_decode_walks.py), for a 16-bit and for an e4m3 cache alike."""
    from kernels import paged_decode_attention as pda

    monkeypatch.setattr(pda, "WALK", request.param)
    monkeypatch.setattr(pda, "FP8_WALK", request.param)
    return request.param
