"""The registry of boxing step kinds: ``KINDS`` (name -> kind), ``kind_of(name)``, ``register``.

Registering a kind is all it takes for the planner to consider it, the executors to run it, lowering
to turn it into an actor and the pictures to draw it. Planning caches depend on which kinds exist, so
every (un)registration tells the modules that asked (``on_change``) to drop them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ...sbp import SbpParallel
from .kind_base import StepKind

KINDS: dict[str, StepKind] = {}
_listeners: list[Callable[[], None]] = []


def on_change(fn: Callable[[], None]) -> Callable[[], None]:
    """Call ``fn`` (a cache's ``cache_clear``) whenever the set of kinds changes."""
    _listeners.append(fn)
    return fn


def _changed() -> None:
    for fn in _listeners:
        fn()


def register(kind: StepKind | type[StepKind]) -> StepKind | type[StepKind]:
    """Add ``kind`` (an instance, or a class made with no arguments: usable as a class decorator)."""
    obj = kind() if isinstance(kind, type) else kind
    if not isinstance(obj, StepKind) or not obj.name:
        raise TypeError(f"register: a boxing kind is a StepKind with a name, got {kind!r}")
    if obj.name in KINDS:
        raise ValueError(f"register: a boxing kind named {obj.name!r} exists already ({KINDS[obj.name]!r})")
    KINDS[obj.name] = obj
    _changed()
    return kind


def unregister(name: str) -> None:
    """Remove the kind called ``name``."""
    kind_of(name)
    del KINDS[name]
    _changed()


@contextmanager
def registered(kind: StepKind) -> Iterator[StepKind]:
    """``kind`` registered for the duration of a ``with`` block (tests, experiments)."""
    register(kind)
    try:
        yield kind
    finally:
        unregister(kind.name)


def kind_of(name: str | StepKind) -> StepKind:
    """The kind called ``name`` (a kind passes through)."""
    if isinstance(name, StepKind):
        return name
    kind = KINDS.get(name)
    if kind is None:
        raise ValueError(f"no boxing step kind {name!r}; known kinds: {', '.join(KINDS)}")
    return kind


def kinds_between(old: SbpParallel, new: SbpParallel) -> tuple[StepKind, ...]:
    """The kinds that turn ``old`` into ``new`` on one mesh axis, in registration order."""
    if old == new:
        return ()
    return tuple(k for k in KINDS.values() if not k.between_placements and k.turns(old, new))


def collective_names() -> tuple[str, ...]:
    """Names a runtime ``Collective`` actor may carry."""
    return tuple(k.name for k in KINDS.values() if k.is_collective)
