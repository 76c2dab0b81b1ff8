"""Load generator for asyncgraph servers (``python -m benchmarks.loadgen --help``).

``cli`` parses options and runs a mode (single point, sweep, overload); ``cluster`` starts or finds
the servers; ``load`` drives one load point through ``worker`` processes; ``ceilings`` measures
what the hardware allows in the same run; ``report`` prints, plots and saves.
"""

from benchmarks.common import RESULTS, loopback_ceiling
from benchmarks.loadgen.ceilings import gather_ceiling, measure_ceilings, sample_ceiling
from benchmarks.loadgen.cluster import Cluster, ensure_partitions, own_servers
from benchmarks.loadgen.load import LoadConfig, run_load

__all__ = [
    "RESULTS",
    "Cluster",
    "LoadConfig",
    "ensure_partitions",
    "gather_ceiling",
    "loopback_ceiling",
    "measure_ceilings",
    "own_servers",
    "run_load",
    "sample_ceiling",
]
