"""``python -m asyncgraph.launch``."""

import sys

from asyncgraph.launch.cli import main

sys.exit(main())
