"""Element counts of index blocks, written independently of sbplab so tests can check its bytes."""

from __future__ import annotations


def block_numel(block) -> int:
    n = 1
    for s, e in block:
        n *= e - s
    return n


def block_overlap(a, b) -> int:
    n = 1
    for (s0, e0), (s1, e1) in zip(a, b):
        n *= max(0, min(e0, e1) - max(s0, s1))
    return n
