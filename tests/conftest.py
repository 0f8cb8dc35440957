# Shared test setup. Triton runs in interpreter mode on CPU-only machines; the variable must be
# set before anything imports triton.
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; this machine has none (run on the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
