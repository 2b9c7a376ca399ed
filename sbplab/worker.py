"""``python -m sbplab.worker --driver HOST:PORT``: join a LocalCluster's driver as one rank.

The cluster's token comes from ``$SBPLAB_TOKEN`` or ``--token-file PATH``, never the command line;
without one the worker refuses to start (see ``runtime.worker_main`` and ``runtime.tokens``)."""

from __future__ import annotations

from .runtime.worker_main import main

if __name__ == "__main__":
    main()
