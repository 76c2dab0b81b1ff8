"""A served model on disk: ``model.json`` (class path, constructor kwargs, fanouts, input tensor)
and ``model.pt`` (its ``state_dict``); or, exported (``serve/export.py``), ``model.json`` with
``"exported": "model.pt2"`` and no class path, and the ``torch.export`` program.

``save_model`` writes one (the examples call it after training); ``load_model`` rebuilds the
module in ``eval()`` mode. The class path is imported, so a model folder is trusted like code;
the weights are read with ``torch.load(weights_only=True)`` (no pickle of arbitrary objects).
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from asyncgraph.errors import InvalidRequestError

__all__ = ["MODEL_JSON", "MODEL_WEIGHTS", "ModelSpec", "export_model", "load_model", "save_model"]

MODEL_JSON = "model.json"
MODEL_WEIGHTS = "model.pt"
_FORMAT = 1


@dataclass(frozen=True)
class ModelSpec:
    """What ``model.json`` holds: how to build the module and how to feed it."""

    name: str
    class_path: str  # "package.module:Class"
    kwargs: dict[str, Any]
    fanouts: list[int]
    feat: str = "feat"
    version: str = "1"
    extra: dict[str, Any] = field(default_factory=dict)
    #: an exported program's file (``serve/export.py``); then no class is imported
    exported: str | None = None

    def to_json(self) -> dict[str, Any]:
        doc = {
            "format": _FORMAT,
            "name": self.name,
            "class": self.class_path if self.exported is None else None,
            "kwargs": self.kwargs,
            "fanouts": self.fanouts,
            "feat": self.feat,
            "version": self.version,
            "extra": self.extra,
        }
        if self.exported is not None:
            doc["exported"] = self.exported
        return doc

    @classmethod
    def from_json(cls, data: Any, source: str) -> ModelSpec:
        if not isinstance(data, Mapping):
            raise InvalidRequestError(f"{source}: expected a JSON object")
        if data.get("format") != _FORMAT:
            raise InvalidRequestError(f"{source}: format {data.get('format')!r}, expected {_FORMAT}")
        exported = data.get("exported")
        if exported is not None and (
            not isinstance(exported, str) or not exported or "/" in exported or exported.startswith(".")
        ):
            raise InvalidRequestError(f"{source}: 'exported' must name a file of the model folder")
        needed = ("name", "fanouts") if exported is not None else ("name", "class", "kwargs", "fanouts")
        missing = [k for k in needed if k not in data]
        if missing:
            raise InvalidRequestError(f"{source}: missing {missing}")
        name, fanouts = data["name"], data["fanouts"]
        class_path, kwargs = data.get("class") or "", data.get("kwargs") or {}
        if not isinstance(name, str) or not name or "/" in name:
            raise InvalidRequestError(f"{source}: 'name' must be a non-empty string without '/'")
        if exported is None and (not isinstance(class_path, str) or class_path.count(":") != 1):
            raise InvalidRequestError(f"{source}: 'class' must be 'module:Class'")
        if not isinstance(kwargs, Mapping):
            raise InvalidRequestError(f"{source}: 'kwargs' must be an object")
        fanouts = _fanouts(fanouts, f"{source}: 'fanouts'")
        return cls(
            name=name,
            class_path=class_path,
            kwargs=dict(kwargs),
            fanouts=fanouts,
            feat=str(data.get("feat", "feat")),
            version=str(data.get("version", "1")),
            extra=dict(data.get("extra") or {}),
            exported=exported,
        )


def _fanouts(value: Any, what: str) -> list[int]:
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise InvalidRequestError(f"{what} must be a non-empty list of integers >= -1")
    for f in value:
        if isinstance(f, bool) or not isinstance(f, int) or f < -1:
            raise InvalidRequestError(f"{what} must be a non-empty list of integers >= -1, got {f!r}")
    return [int(f) for f in value]


def _import_class(class_path: str) -> type[nn.Module]:
    module_name, _, attr = class_path.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise InvalidRequestError(f"model class {class_path!r} cannot be imported: {exc}") from None
    if not (isinstance(obj, type) and issubclass(obj, nn.Module)):
        raise InvalidRequestError(f"model class {class_path!r} is not a torch.nn.Module subclass")
    return obj


def save_model(
    directory: str | Path,
    model: nn.Module,
    *,
    name: str,
    kwargs: Mapping[str, Any],
    fanouts: Sequence[int],
    feat: str = "feat",
    version: str = "1",
    class_path: str | None = None,
) -> Path:
    """Write ``model``'s artifact into ``directory`` (created): its ``state_dict`` and the
    ``model.json`` that rebuilds it (``class_path`` defaults to the model's own class, which
    must be importable by that path). Returns the folder."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    cls = type(model)
    if class_path is None:
        class_path = f"{cls.__module__}:{cls.__qualname__}"
    spec = ModelSpec(name, class_path, dict(kwargs), _fanouts(list(fanouts), "fanouts"), feat, version)
    tmp = out / (MODEL_WEIGHTS + ".tmp")
    torch.save(model.state_dict(), tmp)
    os.replace(tmp, out / MODEL_WEIGHTS)
    tmp = out / (MODEL_JSON + ".tmp")
    tmp.write_text(json.dumps(spec.to_json(), indent=2) + "\n")
    os.replace(tmp, out / MODEL_JSON)
    return out


def export_model(
    directory: str | Path,
    model: nn.Module,
    *,
    name: str,
    fanouts: Sequence[int],
    feat: str = "feat",
    version: str = "1",
) -> Path:
    """Write ``model`` (a ``GraphSAGE``) into ``directory`` as an exported artifact: the
    ``torch.export`` program of its tensor form (``model.pt2``, ``serve/export.py``) and a
    ``model.json`` naming no class, so ``load_model`` imports no model code. Returns the folder."""
    from asyncgraph.serve.export import EXPORTED_PROGRAM, export_program, save_program

    spec = ModelSpec(
        name, "", {}, _fanouts(list(fanouts), "fanouts"), feat, version, exported=EXPORTED_PROGRAM
    )
    program = export_program(model)  # a GraphSAGE, else InvalidRequestError
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    save_program(program, out / EXPORTED_PROGRAM)
    tmp = out / (MODEL_JSON + ".tmp")
    tmp.write_text(json.dumps(spec.to_json(), indent=2) + "\n")
    os.replace(tmp, out / MODEL_JSON)
    return out


def load_model(directory: str | Path, device: str | torch.device = "cpu") -> tuple[ModelSpec, nn.Module]:
    """The spec and the module (weights loaded, ``eval()``, on ``device``) saved in ``directory``."""
    folder = Path(directory)
    source = str(folder / MODEL_JSON)
    try:
        data = json.loads((folder / MODEL_JSON).read_text())
    except FileNotFoundError:
        raise InvalidRequestError(f"{source}: no such file (a model folder holds {MODEL_JSON})") from None
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"{source}: not JSON ({exc.msg} at line {exc.lineno})") from None
    spec = ModelSpec.from_json(data, source)
    if spec.exported is not None:  # a torch.export program: no class imported
        from asyncgraph.serve.export import load_exported

        return spec, load_exported(folder, spec.exported, device).eval()
    try:
        model = _import_class(spec.class_path)(**spec.kwargs)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"{source}: {spec.class_path}(**kwargs) failed: {exc}") from None
    try:
        state = torch.load(folder / MODEL_WEIGHTS, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except (OSError, RuntimeError, ValueError) as exc:  # missing, corrupt or of another model
        raise InvalidRequestError(f"{folder / MODEL_WEIGHTS}: {str(exc)[:500]}") from None
    return spec, model.to(device).eval()
