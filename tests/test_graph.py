"""Graph container: construction, validation, npz loading."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _partition_helpers import DATA

from asyncgraph.errors import DTypeMismatchError, OutOfRangeError, ShapeMismatchError
from asyncgraph.partition.graph import Graph


def test_basic_properties() -> None:
    g = Graph(3, np.array([0, 1, 1], dtype=np.int32), [1, 2, 0], {"x": np.zeros((3, 4))}, {"w": [1, 2, 3]})
    assert (g.num_nodes, g.num_edges) == (3, 3)
    assert g.src.dtype == np.int64 and g.dst.dtype == np.int64
    assert g.in_degrees().tolist() == [1, 1, 1] and g.out_degrees().tolist() == [1, 2, 0]
    assert g.ndata["x"].shape == (3, 4) and g.edata["w"].tolist() == [1, 2, 3]
    assert "num_nodes=3" in repr(g)


@pytest.mark.parametrize(
    ("args", "exc", "match"),
    [
        ((3, [0, 1], [1]), ShapeMismatchError, "same length"),
        ((3, [0, 3], [1, 2]), OutOfRangeError, "src holds node ID 3"),
        ((3, [0, 1], [-1, 2]), OutOfRangeError, "dst holds node ID -1"),
        ((3, [0.0, 1.0], [1, 2]), DTypeMismatchError, "src must hold integer"),
        ((3, [True, False], [1, 2]), DTypeMismatchError, "src must hold integer"),
        ((-1, [], []), ValueError, "num_nodes"),
        ((3, [[0, 1]], [[1, 2]]), ShapeMismatchError, "one-dimensional"),
    ],
)
def test_validation(args: tuple[object, ...], exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        Graph(*args)  # type: ignore[arg-type]
    assert issubclass(exc, ValueError)


def test_tensor_first_dim_mismatch() -> None:
    with pytest.raises(ShapeMismatchError, match=r"ndata\['x'\].*num_nodes=3"):
        Graph(3, [0], [1], {"x": np.zeros(4)})
    with pytest.raises(ShapeMismatchError, match=r"edata\['w'\].*num_edges=1"):
        Graph(3, [0], [1], edata={"w": np.zeros(3)})
    with pytest.raises(ValueError, match="name"):
        Graph(3, [0], [1], {"a/b": np.zeros(3)})


def test_torch_tensors() -> None:
    torch = pytest.importorskip("torch")
    g = Graph(2, torch.tensor([0]), torch.tensor([1]), {"h": torch.ones(2, 3)})
    assert isinstance(g.ndata["h"], np.ndarray) and g.ndata["h"].dtype == np.float32


def test_from_npz_bundled() -> None:
    g = Graph.from_npz(DATA / "cora.npz")
    assert g.num_nodes == 2708 and g.num_edges > 10000
    assert set(g.ndata) == {"feat", "label", "train_mask", "val_mask", "test_mask"} and not g.edata
    assert int(g.ndata["train_mask"].sum()) == 140


def test_from_npz_edge_arrays_and_errors(tmp_path: Path) -> None:
    p = tmp_path / "g.npz"
    np.savez(p, src=np.array([0, 1, 2]), dst=np.array([1, 2, 3]), x=np.zeros(5), w=np.ones(3))
    g = Graph.from_npz(p)
    assert g.num_nodes == 5 and set(g.ndata) == {"x"} and set(g.edata) == {"w"}
    np.savez(p, src=np.array([0, 1, 2]), dst=np.array([1, 2, 3]), x=np.zeros(5), y=np.zeros(7))
    with pytest.raises(ShapeMismatchError, match="'y'"):
        Graph.from_npz(p)
    np.savez(p, src=np.array([0]))
    with pytest.raises(ValueError, match="'dst'"):
        Graph.from_npz(p)
    with pytest.raises(ValueError, match="does not exist"):
        Graph.from_npz(tmp_path / "nope.npz")
