"""``python -m sbplab.worker --driver HOST:PORT``: join a LocalCluster's driver as one rank (see runtime.worker)."""

from __future__ import annotations

from .runtime.worker import main

if __name__ == "__main__":
    main()
