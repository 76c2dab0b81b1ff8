"""How the out-of-core partitioner sizes its work to a memory limit: :func:`plan_run`.

The bytes each stage needs per node and edge (measured; see the comments), the chunk sizes that
follow from ``--memory-limit`` and the worker count, and the refusals of a limit too small for
the method or of a feature row larger than a task may hold (before anything is read).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asyncgraph.errors import InvalidRequestError
from asyncgraph.partition.chunked import ChunkedGraph
from asyncgraph.partition.memory import format_size

__all__ = ["MAIN_BASE", "MIN_ROWS", "WORKER_BASE", "WORK_FORMAT", "Plan", "plan_run"]

MAIN_BASE = 96 << 20  # the main process: interpreter, numpy, the metadata, the sampler
WORKER_BASE = 64 << 20  # a spawned worker before it holds any chunk
SHUFFLE_BYTES = 112  # per edge row in a shuffle piece (ids, relabelled record, sort by part)
SORT_BYTES = 80  # per edge in a sort bucket (records, packed keys, outputs)
MIN_ROWS = 4096
WORK_FORMAT = 2  # the work folder's layout (2: range-grouped spill + counts); in the resume fingerprint
METIS_EDGE_BYTES = 280  # pymetis 2025.2, measured (see plan_run)
# kaminpar 3.7 (64-bit IDs), jet, 2 threads: its peak in-process, fitted on two graphs (R-MAT 2^20:
# 1.05M nodes, 20.0M adjacency entries, 320 MiB plain / 213 MiB compressed; partition_bench's 2^22
# graph: 4.19M nodes, 42.8M entries, 864 / 632 MiB) is ~12 B an entry + ~96 B a node plain and
# ~6.2 B an entry + ~95 B a node compressed (2.4x slower). An input edge gives at most two entries.
# The phases follow one another, so the stage needs the largest of them: the lean CSR build
# (16 B of keys an input edge + xadj, in-degrees, the degree order and its inverse), KaMinPar
# (plus the categories, in-degrees and order it leaves alive), then the relabelling and METIS'
# repairs (~72 B a node, + 16 B of categories and in-degrees in the file's numbering).
KAMINPAR_EDGE_BYTES = 24
KAMINPAR_COMPRESSED_EDGE_BYTES = 13
KAMINPAR_GRAPH_NODE_BYTES = 96 + 24
KAMINPAR_CSR_EDGE_BYTES = 16
KAMINPAR_CSR_NODE_BYTES = 40
KAMINPAR_NODE_BYTES = 88
KAMINPAR_FIXED = 160 << 20  # the CSR build's block temporaries (2M rows) and KaMinPar's own


@dataclass(frozen=True)
class Plan:
    """Chunk sizes derived from the memory limit (edge rows per piece, edges per sort bucket)."""

    limit: int
    workers: int
    assign_need: int
    worker_budget: int
    edge_rows: int
    sort_edges: int
    data_bytes: int
    compress: bool = False  # kaminpar: load the structure compressed (less memory, slower)
    kaminpar_room: int = 0  # kaminpar: bytes its graph may take (the choice made on the real size)


def parquet_reader_bytes(g: ChunkedGraph) -> int:
    """What a task's parquet reader holds besides its rows (see ``chunked_parquet.reader_bytes``)."""
    files = [c for cs in g.edges.values() for c in cs]
    files += [c for d in (*g.node_data.values(), *g.edge_data.values()) for cs in d.values() for c in cs]
    return max((c.reader_bytes for c in files), default=0)


def plan_run(
    g: ChunkedGraph, method: str, limit: int, workers: int, assignment: bool, num_parts: int = 4
) -> Plan:
    """Chunk sizes for ``limit`` bytes, or an error naming the method, what it needs and the limit."""
    n = int(g.node_offsets()[-1])
    e = int(g.edge_offsets()[-1])
    # assign: parts + orig_nids + new_id + the permutation or METIS' structure (src, dst, the
    # symmetric CSR, pymetis' copy and METIS' coarse graphs: the process tree peaked at 2.79 GiB
    # for 2^20 nodes / 10.5M edges, 0.64 GiB for 2^18 / 2.6M: ~265 B an input edge)
    key = "assignment" if assignment else method
    per_node = {"random": 34, "fennel": 34 + 20 * num_parts, "metis": 120, "assignment": 34}
    compress, room = False, 0
    if key == "kaminpar":
        csr = KAMINPAR_CSR_EDGE_BYTES * e + KAMINPAR_CSR_NODE_BYTES * n
        after = KAMINPAR_NODE_BYTES * n
        solve = KAMINPAR_EDGE_BYTES * e + KAMINPAR_GRAPH_NODE_BYTES * n
        assign_need = MAIN_BASE + KAMINPAR_FIXED + max(csr, solve, after)
        if assign_need > limit:  # the compressed graph, if that fits
            compress = True
            solve = KAMINPAR_COMPRESSED_EDGE_BYTES * e + KAMINPAR_GRAPH_NODE_BYTES * n
            assign_need = MAIN_BASE + KAMINPAR_FIXED + max(csr, solve, after)
        room = limit - MAIN_BASE - KAMINPAR_FIXED - KAMINPAR_GRAPH_NODE_BYTES * n
    else:
        per_edge = METIS_EDGE_BYTES if key == "metis" else 0
        assign_need = MAIN_BASE + per_node[key] * n + per_edge * e
    what = "--assignment files" if assignment else f"method {method!r}"
    if assign_need > limit:
        hint = {"metis": " or use --method kaminpar (less memory), fennel (streamed) or random",
                "kaminpar": " or use --method fennel (streamed) or random"}.get(key, "")  # fmt: skip
        raise InvalidRequestError(
            f"{what} needs about {format_size(assign_need)} for {n:,} nodes and {e:,} edges, but "
            f"the memory limit is {format_size(limit)}; raise --memory-limit{hint}"
        )
    budget = (limit - MAIN_BASE) // max(1, workers) - WORKER_BASE - parquet_reader_bytes(g)
    need = MIN_ROWS * SHUFFLE_BYTES + 8 * max(g.node_offsets()[-1] // max(1, 64), 1)
    if budget < need:
        raise InvalidRequestError(
            f"{what} with {workers} workers needs at least "
            f"{format_size(MAIN_BASE + workers * (WORKER_BASE + need))}, but the memory limit is "
            f"{format_size(limit)}; raise --memory-limit or lower --workers"
        )
    data_bytes = max(1 << 16, budget // 3)
    _check_rows(g, data_bytes, workers, limit)
    return Plan(limit, workers, assign_need, budget, max(MIN_ROWS, budget // SHUFFLE_BYTES),
                max(MIN_ROWS, budget // SORT_BYTES), data_bytes, compress, room)  # fmt: skip


def _check_rows(g: ChunkedGraph, data_bytes: int, workers: int, limit: int) -> None:
    """Refuse a tensor whose one row is more than a copy task may hold (it copies at least one
    row, up to three times): before, a 512 MiB row took a run to 1.1 GiB at a 256 MiB limit."""
    per_type: list[tuple[str, Any, dict[str, Any]]] = [("node", t, d) for t, d in g.node_data.items()]
    per_type += [("edge", ":".join(c), d) for c, d in g.edge_data.items()]
    for kind, key, feats in per_type:
        for fname, chunks in feats.items():
            row = chunks[0].row_bytes
            if row > data_bytes:
                need = MAIN_BASE + workers * (WORKER_BASE + 3 * row)
                raise InvalidRequestError(
                    f"{kind} data {key}/{fname}: one row is {format_size(row)} (row shape "
                    f"{chunks[0].row_shape}), more than the {format_size(data_bytes)} a task may read at "
                    f"once under the memory limit of {format_size(limit)} with {workers} workers; raise "
                    f"--memory-limit to at least {format_size(need)} or lower --workers"
                )
