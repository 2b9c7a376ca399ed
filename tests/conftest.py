"""Shared fixtures, kept tiny and generic."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run torch on one intra-op thread: tests use tiny tensors, and on a small shared machine the
    thread pool's spinning costs more than the work (an 8-rank signature sweep runs ~10x faster)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
