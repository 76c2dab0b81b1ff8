"""CLI: ``python -m asyncgraph.partition --input g.npz --graph-name g --num-parts 2 --out dir``.

``--input DIR/metadata.json`` (or ``--input DIR``) reads DGL's chunked graph format instead and
partitions it out of core within ``--memory-limit`` on ``--workers`` processes (or a Dask cluster,
``--dask-scheduler``); ``--assignment DIR`` takes DGL's ``<ntype>.txt`` assignment files;
``--resume`` restarts a killed chunked run after its last finished stage; ``--part-dir P=DIR``
writes partition P into DIR, and ``--part-worker P=ADDRESS`` writes it from that Dask worker only
(so DIR may be that host's local disk).

Prints stage timings to stderr while it works and a per-partition summary table at the end.
Writes ``orig_nids.npy``/``orig_eids.npy`` beside the config (``orig_nids[new_id] == input ID``;
``asyncgraph.partition.load_orig_ids(config)`` reads them) to map results back to input IDs.
Bad input (a missing, empty, truncated or malformed npz; bad options) is one ``error:`` line and
exit status 2. SIGTERM removes the temporary output folder and exits 143; temporary folders of
earlier killed runs are removed at the next run.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from asyncgraph.cli import CliError, Parser, configure_logging, run_main
from asyncgraph.partition.assign import METHODS
from asyncgraph.partition.cli_chunked import add_chunked_options, check_npz_options, run_chunked
from asyncgraph.partition.graph import Graph
from asyncgraph.partition.layout import ORIG_EIDS_FILE, ORIG_NIDS_FILE, config_file
from asyncgraph.partition.partitioner import partition_graph
from asyncgraph.partition.reader import format_summary, summarize_partitions

MASKS = ("train_mask", "val_mask", "test_mask")


def train_categories(graph: Graph) -> npt.NDArray[np.int64] | None:
    """Category per node for balancing: 0 train, 1 val, 2 test, 3 other (None without masks).

    A node in several masks takes the first of train, val, test.
    """
    present = [m for m in MASKS if m in graph.ndata]
    if not present:
        return None
    cat = np.full(graph.num_nodes, len(MASKS), dtype=np.int64)
    for code in range(len(MASKS) - 1, -1, -1):  # reversed, so train wins over val over test
        mask = graph.ndata.get(MASKS[code])
        if mask is not None:
            cat[np.asarray(mask, dtype=bool).reshape(-1)] = code
    return cat


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM unwinds like an exception, so the partitioner removes its temporary folder."""
    raise SystemExit(128 + signum)


def build_parser() -> Parser:
    ap = Parser(prog="python -m asyncgraph.partition", description=__doc__, raw_description=True)
    ap.add_argument(
        "--input",
        required=True,
        type=Path,
        help="graph .npz, or DGL chunked format's metadata.json or its folder",
    )
    ap.add_argument(
        "--graph-name",
        help="name of the graph (the JSON file is <out>/<name>.json); chunked input: default its graph_name",
    )
    ap.add_argument("--num-parts", required=True, type=int, help="number of partitions (servers) to cut into")
    ap.add_argument(
        "--method",
        "--part-method",
        default="metis",
        choices=(*METHODS, "kaminpar", "fennel"),
        help="assignment method (default metis; chunked input only: kaminpar, fennel)",
    )
    ap.add_argument(
        "--balance-train",
        action="store_true",
        help="balance train/val/test/other nodes across parts (needs *_mask arrays)",
    )
    ap.add_argument("--balance-edges", action="store_true", help="also balance in-edges per part")
    ap.add_argument(
        "--num-trainers-per-machine",
        type=int,
        default=1,
        help="split each partition into this many contiguous trainer ranges (node tensor trainer_id)",
    )
    ap.add_argument("--out", required=True, type=Path, help="output folder for the JSON and part<p>/ folders")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing partitioning in --out")
    ap.add_argument("--seed", type=int, default=0, help="random seed of the assignment (default 0)")
    add_chunked_options(ap)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, partition the npz graph, print the summary; returns the exit code."""
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, "partition")
    signal.signal(signal.SIGTERM, _terminate)
    return run_main("python -m asyncgraph.partition", lambda: _run(args))


def _run(args: Any) -> int:
    if args.input.is_dir():  # DGL's tools take the chunked graph's folder
        if not (args.input / "metadata.json").is_file():
            raise CliError(f"--input {args.input} is a folder without metadata.json (a chunked graph's "
                           "folder has one: DGL's chunked graph format)")  # fmt: skip
        args.input = args.input / "metadata.json"
    if not args.input.is_file():
        raise CliError(f"--input {args.input} does not exist")
    if args.num_parts < 1:
        raise CliError(f"--num-parts must be at least 1, got {args.num_parts}")
    if args.input.suffix == ".json":
        return run_chunked(args)
    check_npz_options(args)
    t0 = time.perf_counter()
    graph = Graph.from_npz(args.input)
    print(
        f"loaded {args.input} in {time.perf_counter() - t0:.2f} s "
        f"({graph.num_nodes:,} nodes, {graph.num_edges:,} edges)",
        file=sys.stderr,
        flush=True,
    )
    cats = None
    if args.balance_train:
        cats = train_categories(graph)
        if cats is None:
            print(
                "--balance-train: no train/val/test masks in the input; balancing node counts only",
                file=sys.stderr,
            )
    partition_graph(
        graph,
        args.graph_name,
        args.num_parts,
        args.out,
        part_method=args.method,
        balance_ntypes=cats,
        balance_edges=args.balance_edges,
        seed=args.seed,
        overwrite=args.overwrite,
        progress=True,
        num_trainers_per_machine=args.num_trainers_per_machine,
    )
    del graph
    print(
        f"done in {time.perf_counter() - t0:.2f} s; wrote {config_file(args.out, args.graph_name)} "
        f"and the ID mapping {args.out / ORIG_NIDS_FILE}, {args.out / ORIG_EIDS_FILE}",
        file=sys.stderr,
    )
    print(format_summary(summarize_partitions(config_file(args.out, args.graph_name))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
