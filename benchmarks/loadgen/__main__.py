"""``python -m benchmarks.loadgen``."""

import sys

from benchmarks.loadgen.cli import main

sys.exit(main())
