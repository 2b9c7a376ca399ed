"""The main job of ``make demo``: for now the SBP tour (``sbplab.tour``)."""

from __future__ import annotations

from .tour import main

if __name__ == "__main__":
    main()
