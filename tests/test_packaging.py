"""Packaging: ``python -m build`` makes a wheel and an sdist of this checkout, the wheel holds every
tracked file of the package (``py.typed`` included) and installs into a fresh venv where its
smoke test runs (import, ``python -m asyncgraph.server --help``, the numba kernels compile from the
installed files, a standalone epoch on bundled Cora); the version comes from git tags.

The fresh venv gets only our wheel (``pip install --no-deps --no-index``); its dependencies
(torch and the rest) are those of the running interpreter's environment, made visible by a
``.pth`` line naming its site-packages, so nothing is downloaded. A ``.pth`` line adds a path
without running that folder's own ``.pth`` files, so an editable install of asyncgraph there is
not seen: ``asyncgraph.__file__`` is checked to be the wheel's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import build  # noqa: F401  ([dev]: python -m build, without isolation so nothing is downloaded)
import pytest
import setuptools_scm  # noqa: F401  ([dev]: the version from git tags)

ROOT = Path(__file__).resolve().parent.parent
KERNELS = (
    "asyncgraph.kernels.compiled:SAMPLING",
    "asyncgraph.kernels.gather:GATHER",
    "asyncgraph.dataloading.relabel_kernel:RELABEL",
    "asyncgraph.inference_kernel:NEIGHBOUR_SUM",
)


def _run(cmd: list[str], cwd: Path, timeout: float, stdout_only: bool = False) -> str:
    """Run ``cmd`` without this checkout on ``PYTHONPATH``; its output (stdout and stderr, or
    stdout alone), or a failure showing both."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    out = res.stdout + res.stderr
    assert res.returncode == 0, f"{cmd} exited {res.returncode}:\n{out[-4000:]}"
    return res.stdout if stdout_only else out


def _tracked_package_files() -> set[str]:
    out = subprocess.run(
        ["git", "ls-files", "asyncgraph"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
    )
    return set(out.stdout.split())


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel and sdist of this checkout, built without isolation (no download)."""
    out = tmp_path_factory.mktemp("dist")
    egg_info = ROOT / "asyncgraph.egg-info"  # the sdist step writes it into the checkout
    made_egg_info = not egg_info.exists()
    try:
        _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)], out, 300)
    finally:
        if made_egg_info:
            shutil.rmtree(egg_info, ignore_errors=True)
    return out


def test_wheel_holds_the_package_and_its_data(dist: Path) -> None:
    """Every tracked file under ``asyncgraph/`` (sources, numba kernels, ``py.typed``) is in the
    wheel and nothing else of the repository is; the sdist has the sources and the bundled data."""
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    names = set(zipfile.ZipFile(wheel).namelist())
    package = {n for n in names if n.startswith("asyncgraph/")}
    assert package == _tracked_package_files(), package ^ _tracked_package_files()
    assert "asyncgraph/py.typed" in package
    assert {n for n in names if not n.startswith("asyncgraph")} == set(), names  # no tests/, docs/ ...
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    assert {"pyproject.toml", "asyncgraph/py.typed", "examples/data/pubmed.npz", "CHANGELOG.md"} <= members


def test_wheel_installs_into_a_fresh_venv_and_runs(dist: Path, tmp_path: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, 120)
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", str(wheel)]
    _run(pip, tmp_path, 120)
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path, 30)
    (Path(purelib.strip()) / "_outer_site_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    version = wheel.name.split("-")[1]
    show = "import asyncgraph; print(asyncgraph.__file__, asyncgraph.__version__)"
    where = _run([python, "-c", show], tmp_path, 60, stdout_only=True)
    assert where.split() == [str(Path(purelib.strip()) / "asyncgraph" / "__init__.py"), version], where
    assert "--part-config" in _run([python, "-m", "asyncgraph.server", "--help"], tmp_path, 60)

    # the numba kernels compile from the installed files (each set in a child, cached in the venv)
    imports = [spec.split(":") for spec in KERNELS]
    check = "; ".join(
        f"from {module} import {name} as k{i}; assert k{i}.wait_ready(240), {name!r}"
        for i, (module, name) in enumerate(imports)
    )
    _run([python, "-c", check], tmp_path, 600)

    data = ROOT / "examples" / "data" / "cora.npz"
    partition = [python, "-m", "asyncgraph.partition", "--input", str(data), "--graph-name", "cora"]
    _run([*partition, "--num-parts", "1", "--out", str(tmp_path / "cora1")], tmp_path, 120)
    config = tmp_path / "cora1" / "cora.json"
    train = [python, str(ROOT / "examples" / "train_dist.py"), "--part-config", str(config)]
    out = _run([*train, "--epochs", "1", "--no-progress"], tmp_path, 300)
    assert "standalone" in out and "RESULT" in out, out[-3000:]


def test_version_comes_from_the_git_tag(tmp_path: Path) -> None:
    """A tag ``vX.Y.Z`` at HEAD is the version; a copy without git metadata gets the fallback.
    The tag is made in a throwaway clone, never in this repository."""
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()
    clone = tmp_path / "clone"
    _run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(clone)], tmp_path, 120)
    _run(["git", "-c", "advice.detachedHead=false", "checkout", "--quiet", head], clone, 120)
    _run(["git", "tag", "v9.8.7"], clone, 30)
    config = str(ROOT / "pyproject.toml")  # this checkout's settings, HEAD's history
    scm = [sys.executable, "-m", "setuptools_scm", "-c", config]
    assert _run([*scm, "-r", str(clone)], tmp_path, 60, stdout_only=True).strip() == "9.8.7"
    shutil.rmtree(clone / ".git")  # an archive of the tree: no history, no tag
    shutil.copy(config, clone / "pyproject.toml")
    bare = [sys.executable, "-m", "setuptools_scm", "-c", str(clone / "pyproject.toml"), "-r", str(clone)]
    assert _run(bare, tmp_path, 60, stdout_only=True).strip() == "0.1.0.dev0"
