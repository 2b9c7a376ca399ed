"""Shared fixtures, kept tiny and generic."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from hypothesis import settings


def pytest_configure(config):
    """A suite started in the background of a non-interactive shell (``make test &``, ``nohup``) inherits
    SIGINT ignored, and so would every worker and driver it starts: the Ctrl-C tests would test the
    launcher, not sbplab. Python's own handler is put back, so children start with the default again.

    ``make test-fast`` (SBPLAB_TEST_FAST=1) deselects the multiprocess, browser, faults and slow
    markers; a test that starts worker processes without its marker fails there, so the inner loop
    stays fast and the markers stay true."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if os.environ.get("SBPLAB_TEST_FAST") == "1":
        from sbplab.runtime import cluster

        def unmarked(*args, **kwargs):
            raise RuntimeError("this test starts worker processes but is not marked `multiprocess` "
                               "(pytest.mark.multiprocess), so `make test-fast` would run it")

        cluster.spawn_worker = unmarked


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run torch on one intra-op thread: tests use tiny tensors, and on a small shared machine the
    thread pool's spinning costs more than the work (an 8-rank signature sweep runs ~10x faster)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# hypothesis: a small profile by default (each property file well under a minute here), and a large
# one (>= 10,000 examples per test) for a long soak: SBPLAB_HYPOTHESIS_PROFILE=large pytest ...
settings.register_profile("small", max_examples=40, deadline=None)
settings.register_profile("large", max_examples=10_000, deadline=None)
settings.load_profile(os.environ.get("SBPLAB_HYPOTHESIS_PROFILE", "small"))


def check_generated_doc(doc, text: str, how: str) -> None:
    """A generated page equals what its generator renders now; SBPLAB_WRITE_DOCS=1 rewrites it."""
    import os

    if os.environ.get("SBPLAB_WRITE_DOCS") == "1":
        doc.write_text(text)
    assert doc.exists(), f"{doc.name} is missing: {how}"
    assert doc.read_text() == text, f"{doc.name} is out of date: rewrite it with {how}"
