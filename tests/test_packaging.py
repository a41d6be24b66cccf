"""Packaging: a plain (non-editable) install carries every data file the code reads at run
time, and ``hrm-search`` works from a folder outside the checkout (issue 11).

The wheel is built from a copy of the working tree (the checkout is left alone), both the
way ``pip install .`` builds it (from the tree) and the way ``python -m build`` does (from the
sdist). It is installed into a fresh venv whose dependencies come from the running
environment (a ``.pth`` naming its site-packages: offline and fast); the running
environment's editable install is not activated there, and the test checks that ``hrm`` is
imported from the venv. Everything runs offline with the running environment's pip and
setuptools (``--no-build-isolation --no-index``). About 10 s.
"""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROFILES = sorted(p.name for p in (ROOT / "hardware_profiles").glob("*.yaml"))
MODELS = sorted(p.name for p in (ROOT / "hrm" / "data" / "models").glob("*.json"))
ENGINES = sorted(p.name for p in (ROOT / "hrm" / "data" / "engines").glob("*.yaml"))

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="venv layout (bin/) of POSIX")


def _env() -> dict[str, str]:
    """The environment without anything that would put the checkout on sys.path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONNOUSERSITE="1", COLUMNS="120")
    return env


def _run(cmd: list, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, (f"{' '.join(map(str, cmd))} exited {result.returncode}\n"
                                    f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def _copy_tree(dest: Path) -> Path:
    """The working tree as git sees it (tracked and untracked files that are not ignored),
    or, without git, the folder minus build outputs and environments."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, check=True, timeout=60).stdout
        files = [f for f in listed.decode().split("\0") if f and (ROOT / f).is_file()]
    except (OSError, subprocess.SubprocessError):
        files = []
    if files:
        for name in files:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    else:
        shutil.copytree(ROOT, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(
            ".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", "out"))
    return dest


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(sdist, wheel built from the tree, wheel built from the sdist)."""
    pytest.importorskip("setuptools", reason="building needs setuptools (the [test] extra has it)")
    base = tmp_path_factory.mktemp("packaging")
    src = _copy_tree(base / "src")
    sdist_dir, tree_dir, from_sdist_dir = base / "sdist", base / "wheel-tree", base / "wheel-sdist"
    # the PEP 517 hook `python -m build --sdist --no-isolation` calls
    _run([sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(sdist_dir)!r})"],
         cwd=src)
    (sdist,) = sdist_dir.glob("*.tar.gz")
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    _run([*pip_wheel, "-w", tree_dir, src], cwd=base)  # what `pip install .` builds
    _run([*pip_wheel, "-w", from_sdist_dir, sdist], cwd=base)  # what `python -m build` builds
    (tree_wheel,) = tree_dir.glob("*.whl")
    (sdist_wheel,) = from_sdist_dir.glob("*.whl")
    return sdist, tree_wheel, sdist_wheel


def _wheel_names(path: Path) -> set[str]:
    with zipfile.ZipFile(path) as wheel:
        return set(wheel.namelist())


def test_shipped_data_files_exist_in_the_checkout():
    assert "l4.yaml" in PROFILES and "mixtral-8x7b.json" in MODELS and "ideal.yaml" in ENGINES


def test_wheel_carries_every_data_file(built):
    _, tree_wheel, sdist_wheel = built
    names = _wheel_names(tree_wheel)
    wanted = {f"hrm/data/hardware_profiles/{p}" for p in PROFILES}
    wanted |= {f"hrm/data/models/{m}" for m in MODELS}
    wanted |= {f"hrm/data/engines/{e}" for e in ENGINES}
    wanted |= {"hrm/data/plan.schema.json", "hrm/machine/hardware.py", "hrm_cli/__init__.py"}
    assert wanted <= names, sorted(wanted - names)
    assert not any(n.startswith(("tests/", "hardware_profiles/")) for n in names)
    # the same files whether built from the tree (pip install .) or from the sdist (python -m build)
    assert _wheel_names(sdist_wheel) == names


def test_sdist_carries_the_top_level_hardware_profiles(built):
    sdist, _, _ = built
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert {f"hardware_profiles/{p}" for p in PROFILES} <= names
    assert {"setup.py", "MANIFEST.in", "pyproject.toml"} <= names


def _site_packages_of_running_env() -> list[str]:
    paths = [*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    return list(dict.fromkeys(p for p in paths if Path(p).is_dir()))


def test_installed_wheel_plans_from_another_folder(built, tmp_path):
    _, wheel, _ = built
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   cwd=tmp_path).stdout.strip()
    # dependencies from the running environment; a plain path line does not run the .pth files
    # there, so an editable install of the checkout stays inactive in this venv
    Path(purelib, "_running_env_site_packages.pth").write_text("\n".join(_site_packages_of_running_env()) + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index",
          "--force-reinstall", wheel], cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run([python, "-c", "import hrm, hrm.machine.hardware as h; print(hrm.__file__); print(h.PROFILES_DIR)"],
                 cwd=elsewhere).stdout.split()
    assert all(Path(p).resolve().is_relative_to(venv.resolve()) for p in where), where  # the wheel, not the checkout
    result = _run([venv / "bin" / "hrm-search", "--hw", "l4.yaml", "--model", "mixtral"], cwd=elsewhere)
    assert re.search(r"policy\s.*N=\d+\s+mu=\d+\s+n=\d+", result.stdout), result.stdout
