"""The graphs bundled with asyncgraph's examples as PyG datasets (``dataset[0]``, ``num_classes``).

``Planetoid(root, name)`` reads ``root/<name>.npz`` (Cora, CiteSeer, PubMed) as a ``Data``
(``x``, ``y``, ``train_mask``, ``val_mask``, ``test_mask``, ``edge_index``: Planetoid's public
split); ``ACM(root)`` reads ``root/acm.npz`` as a ``HeteroData`` with papers, authors and
subjects (``x`` for every type: a paper's normalised bag of its ``words`` most frequent words,
an author's or a subject's the mean of its papers', so every type has the same width, as
``OGB_MAG(preprocess='metapath2vec')`` gives; ``y`` and the split masks on papers).
``transform`` is applied to ``dataset[0]``, as PyG's datasets apply theirs. They stand in for
PyG's downloading datasets (``Planetoid``, ``OGB_MAG``, ``PygNodePropPredDataset``) in ported
scripts and in ``python -m asyncgraph.pyg.partition_dataset``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data, HeteroData

from asyncgraph.errors import InvalidRequestError

__all__ = ["ACM", "DATASETS", "BundledDataset", "Planetoid", "PubMed"]


class BundledDataset:
    """One graph read from ``root/<file>``; ``dataset[0]`` is it, with ``transform`` applied."""

    file = ""

    def __init__(self, root: str | Path, transform: Callable[[Any], Any] | None = None) -> None:
        self.root = Path(root)
        self.transform = transform
        path = self.root / self.file
        if not path.is_file():
            raise InvalidRequestError(f"{type(self).__name__}: no {self.file} in {self.root}")
        self._data = self._load(path)

    def _load(self, path: Path) -> Data | HeteroData:
        raise NotImplementedError

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> Any:
        if index not in (0, -1):
            raise IndexError(f"{type(self).__name__} holds one graph, not graph {index}")
        data = self._data.clone()
        return data if self.transform is None else self.transform(data)

    @property
    def num_classes(self) -> int:
        y = self._data["paper"].y if isinstance(self._data, HeteroData) else self._data.y
        return int(y.max()) + 1

    @property
    def num_features(self) -> int:
        x = self._data["paper"].x if isinstance(self._data, HeteroData) else self._data.x
        return int(x.size(-1))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root})"


class Planetoid(BundledDataset):
    """PyG's ``Planetoid(root, name)`` for the bundled ``Cora``, ``CiteSeer`` and ``PubMed``
    (``root/<name lower-cased>.npz``), with Planetoid's public split."""

    def __init__(self, root: str | Path, name: str, transform: Callable[[Any], Any] | None = None) -> None:
        self.name = name
        self.file = f"{name.lower()}.npz"
        super().__init__(root, transform)

    def _load(self, path: Path) -> Data | HeteroData:
        z = np.load(path)
        edge_index = torch.from_numpy(np.stack([z["src"], z["dst"]]).astype(np.int64))
        data = Data(x=torch.from_numpy(z["feat"]), y=torch.from_numpy(z["label"]), edge_index=edge_index)
        for split in ("train", "val", "test"):
            data[f"{split}_mask"] = torch.from_numpy(z[f"{split}_mask"].astype(bool))
        return data


class ACM(BundledDataset):
    """ACM (4,019 papers, their authors and subjects; 3 classes of paper), ``words`` features."""

    file = "acm.npz"

    def __init__(
        self, root: str | Path, transform: Callable[[Any], Any] | None = None, words: int = 512
    ) -> None:
        self.words = words
        super().__init__(root, transform)

    def _load(self, path: Path) -> HeteroData:
        z = np.load(path)
        bits = np.unpackbits(z["words:paper"], axis=1)[:, : int(z["num_words"])].astype(np.float32)
        keep = np.argsort(-bits.sum(0), kind="stable")[: self.words]  # the most frequent words
        paper = bits[:, keep]
        paper /= np.maximum(paper.sum(1, keepdims=True), 1.0)
        data = HeteroData()
        data["paper"].x = torch.from_numpy(paper)
        data["paper"].y = torch.from_numpy(z["label:paper"].astype(np.int64))
        for split in ("train", "val", "test"):
            data["paper"][f"{split}_mask"] = torch.from_numpy(z[f"{split}_mask:paper"].astype(bool))
        for rel, other in (("written-by", "author"), ("has-subject", "subject")):
            src, dst = z[f"src:paper:{rel}:{other}"], z[f"dst:paper:{rel}:{other}"]
            num = int(z[f"num_nodes:{other}"])
            mean = np.zeros((num, paper.shape[1]), dtype=np.float32)
            np.add.at(mean, dst, paper[src])
            mean /= np.maximum(np.bincount(dst, minlength=num), 1)[:, None].astype(np.float32)
            data[other].x = torch.from_numpy(mean)
            data["paper", rel, other].edge_index = torch.from_numpy(np.stack([src, dst]).astype(np.int64))
        return data


class PubMed(Planetoid):
    """PubMed (19,717 papers, 500 TF-IDF features, 3 classes) with Planetoid's public split."""

    def __init__(self, root: str | Path, transform: Callable[[Any], Any] | None = None) -> None:
        super().__init__(root, "PubMed", transform)


#: The bundled datasets by the names ``partition_dataset`` and the ported scripts use.
DATASETS: dict[str, type[BundledDataset]] = {"pubmed": PubMed, "acm": ACM}
