"""A progress bar over steps that works in a terminal and in a notebook (tqdm.auto picks the widget).

It moves as each step finishes on every rank and shows that step's loss."""

from __future__ import annotations


class SilentBar:
    """What a disabled progress bar is: tqdm's methods, doing nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, *args, **kwargs) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass


def step_bar(total: int, enabled: bool, desc: str = "steps"):
    """A tqdm bar (notebook widget or terminal text) or a silent stand-in when disabled."""
    if not enabled:
        return SilentBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is a dependency, but a bar is never worth failing a run for
        return SilentBar()
    return tqdm(total=total, desc=desc, unit="step", leave=True)
