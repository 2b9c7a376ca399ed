"""Why a worker ended or went quiet, in words: exit codes, stopped processes, a victim's echo.

A failure on one rank shows up on the others too: a SIGKILLed rank closes its Gloo connections,
so the ranks waiting on it fail their collective a moment later, and a stopped (SIGSTOP, a
debugger) rank leaves the others waiting in a collective, which looks like the hang. The driver
uses these helpers to blame the rank where it started, not the first rank that complained.
"""

from __future__ import annotations

import signal

# the OOM killer (and ``docker``/Kubernetes when a container runs out of memory) ends a process
# with SIGKILL; shells and container runtimes report that as 128 + 9
_OOM_HINT = "out of memory? the OOM killer sends SIGKILL"


def exit_text(code: int | None) -> str:
    """An exit code in words: ``-9`` is SIGKILL, ``137`` is 128 + SIGKILL (a shell's or a container's
    way of saying so), both with the OOM killer as a likely sender."""
    if code is None:
        return "an unknown exit code"
    sig, how = (-code, "") if code < 0 else (code - 128, "128 + ")
    if sig <= 0 or _signal_name(sig) is None:
        return f"exit code {code}"
    hint = f"; {_OOM_HINT}" if sig == signal.SIGKILL else ""
    return f"exit code {code} ({how}{_signal_name(sig)}{hint})"


def _signal_name(num: int) -> str | None:
    try:
        return signal.Signals(num).name
    except ValueError:
        return None


def process_state(pid: int | None) -> str | None:
    """The state letter of ``pid`` in /proc ("R", "S", "D", "T" stopped, "t" traced, "Z" zombie), or
    None where there is no such process or no /proc (not Linux)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def stopped_text(state: str | None) -> str | None:
    """Words for a process that cannot run at all, or None if ``state`` is not such a state."""
    if state == "T":
        return "is stopped (process state T: SIGSTOP, SIGTSTP or Ctrl-Z); it cannot answer or make progress"
    if state == "t":
        return "is stopped by a debugger (process state t: traced)"
    return None
