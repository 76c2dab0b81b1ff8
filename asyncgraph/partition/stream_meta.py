"""The partition's metadata in the out-of-core run: tensor specs, type tensors, the JSON config.

Split from :mod:`asyncgraph.partition.stream` (its ``node data``, ``edge data`` and ``commit``
stages call these); everything here matches what :func:`partition_graph` writes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from asyncgraph.names import ETYPE, NTYPE, TYPE_EID
from asyncgraph.partition.chunked import ChunkedGraph
from asyncgraph.partition.config import PartitionConfig, PartSpec, TensorSpec
from asyncgraph.partition.fingerprint import canonical_config, fingerprint_part, stamp_fingerprints
from asyncgraph.partition.layout import ORIG_EIDS_FILE, ORIG_NIDS_FILE, config_file, part_dir_name
from asyncgraph.partition.reader import load_partition
from asyncgraph.partition.tasks import Ctx

__all__ = [
    "check_and_stamp",
    "check_config",
    "check_part",
    "etype_counts",
    "finalize",
    "tensor_specs",
    "type_edges_before",
]


def tensor_specs(
    g: ChunkedGraph,
) -> tuple[dict[str, tuple[str, tuple[int, ...]]], dict[str, tuple[str, tuple[int, ...]]]]:
    """The partition's node and edge tensors in the order ``partition_graph`` writes them."""
    if g.is_homogeneous:
        (t,), (c,) = g.ntypes, g.canonical_etypes
        nd = {k: (v[0].dtype, v[0].row_shape) for k, v in g.node_data.get(t, {}).items()}
        ed = {k: (v[0].dtype, v[0].row_shape) for k, v in g.edge_data.get(c, {}).items()}
        return nd, ed
    nd, ed = g.feature_specs("node"), g.feature_specs("edge")
    nd[NTYPE] = ("int64", ())
    ed[ETYPE] = ("int64", ())
    ed[TYPE_EID] = ("int64", ())
    return nd, ed


def type_edges_before(ctx: Ctx, rows: int) -> list[list[int]]:
    """Per part, the edges of each type in earlier parts (the start of ``_TYPE_EID``)."""
    eoff = ctx.graph.edge_offsets()
    per_part = []
    for p in range(ctx.num_parts):
        oe = ctx.oeids(p)
        counts = np.zeros(eoff.size - 1, dtype=np.int64)
        for a in range(0, oe.shape[0], rows):
            counts += np.bincount(np.searchsorted(eoff, np.asarray(oe[a : a + rows]), side="right") - 1,
                                  minlength=eoff.size - 1)  # fmt: skip
        per_part.append(counts)
    cum = np.cumsum([np.zeros(eoff.size - 1, np.int64), *per_part], axis=0)
    return [cum[p].tolist() for p in range(ctx.num_parts)]


Specs = dict[str, tuple[str, tuple[int, ...]]]


def finalize(
    ctx: Ctx, name: str, opts: dict[str, Any], nspecs: Specs, especs: Specs, state: dict[str, Any], rows: int,
    final_dirs: list[str],
) -> None:
    """``orig_eids`` and the JSON config; a part with a ``final_dirs`` entry is listed at that
    absolute path (``--part-dir``), the others as ``part<p>`` beside the config."""
    g = ctx.graph
    e = int(g.edge_offsets()[-1])
    # orig_eids.npy: preallocated by the sort stage, written in place by the sort tasks
    nb, eb = ctx.node_bounds, ctx.edge_bounds
    specs = [PartSpec(part_id=p, node_range=(nb[p], nb[p + 1]), edge_range=(eb[p], eb[p + 1]),
                      path=final_dirs[p] or part_dir_name(p)) for p in range(ctx.num_parts)]  # fmt: skip
    ts = {k: TensorSpec(dtype=np.dtype(d).name, row_shape=list(s)) for k, (d, s) in nspecs.items()}
    es = {k: TensorSpec(dtype=np.dtype(d).name, row_shape=list(s)) for k, (d, s) in especs.items()}
    config = PartitionConfig(
        graph_name=name, num_nodes=int(g.node_offsets()[-1]), num_edges=e, num_parts=ctx.num_parts,
        part_method=opts["method"] if opts["assignment"] == "None" else "assignment", parts=specs,
        node_feats=ts, edge_feats=es, orig_nids=ORIG_NIDS_FILE, orig_eids=ORIG_EIDS_FILE,
    )  # fmt: skip
    if not g.is_homogeneous:
        config.ntypes = g.ntypes
        config.canonical_etypes = g.canonical_etypes
        config.ntype_counts = state["type_counts"]
        config.etype_counts = etype_counts(ctx, rows)
        config.ntype_feats = {t: sorted(g.node_data.get(t, {})) for t in g.ntypes}
        config.etype_feats = {":".join(c): sorted(g.edge_data.get(c, {})) for c in g.canonical_etypes}
    config_file(ctx.out, name).write_text(config.model_dump_json(indent=2))


def etype_counts(ctx: Ctx, rows: int) -> list[list[int]]:
    """Per part, its edges of each type."""
    before = type_edges_before(ctx, rows)
    eoff = ctx.graph.edge_offsets()
    total = np.diff(eoff)
    after = [*before[1:], total.tolist()]
    return [(np.asarray(a) - np.asarray(b)).tolist() for a, b in zip(after, before, strict=True)]


def check_config(ctx: Ctx, name: str) -> str:
    """A copy of the finished config in the work folder listing every part where it is built,
    so each part can be loaded and checked (:func:`check_part`) before anything is put in place."""
    config = PartitionConfig.load(config_file(ctx.out, name))
    for p, spec in enumerate(config.parts):
        spec.path = str(ctx.pdir(p).absolute())
    path = ctx.work / "check.json"
    path.write_text(config.model_dump_json())
    return str(path)


def check_part(check_json: str, p: int, config_json: bytes) -> str:
    """Task: load part ``p`` as a server will (shapes, dtypes, ranges), raising what is wrong,
    and return its fingerprint (``config_json``: the final config's ``canonical_config``); run
    before the output is renamed into place, so a failed run leaves no output."""
    part = load_partition(check_json, p)
    return fingerprint_part(config_json, p, part.config.part_dir(check_json, p))


def check_and_stamp(
    ctx: Ctx, name: str, check_json: str, parts: list[int], at_parts: Callable[..., list[Any]]
) -> None:
    """Run :func:`check_part` for every part where its files are (``Runner.at_parts``) and record
    the fingerprints they return in the finished config (issue 34: servers trust them)."""
    final = config_file(ctx.out, name)
    canon = canonical_config(json.loads(final.read_text()))
    prints = at_parts(check_part, [(check_json, p, canon) for p in parts], parts, "check parts")
    stamp_fingerprints(final, prints)
