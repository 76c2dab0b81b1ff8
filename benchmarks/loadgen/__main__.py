"""``python -m benchmarks.loadgen``."""

from benchmarks.loadgen.cli import main

main()
