"""``python -m asyncgraph.serve``: see :mod:`asyncgraph.serve.main`."""

from asyncgraph.serve.main import main

if __name__ == "__main__":
    raise SystemExit(main())
