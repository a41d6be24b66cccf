"""Build hook (the project's metadata is in pyproject.toml).

The shipped hardware profiles live at the top level, ``hardware_profiles/*.yaml`` (one copy in
git). A plain install has no checkout next to the package, so ``build_py`` copies them into
the built package as ``hrm/data/hardware_profiles/``, where :mod:`hrm.machine.hardware` looks first;
MANIFEST.in puts them into the sdist so that a wheel built from it has them too. An editable
install reads them from the checkout instead.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROFILES = "hardware_profiles"
PACKAGE_PROFILES = ("hrm", "data", "hardware_profiles")


class build_py_with_profiles(build_py):
    """``build_py`` plus the top-level hardware profiles as package data of ``hrm``."""

    def _profile_sources(self) -> list[Path]:
        files = sorted((ROOT / PROFILES).glob("*.yaml"))
        if not files:
            raise SystemExit(f"setup.py: no {PROFILES}/*.yaml next to setup.py (an sdist without them?)")
        return files

    def _profile_target(self) -> Path:
        return Path(self.build_lib, *PACKAGE_PROFILES)

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # the checkout's hardware_profiles/ is read directly
        target = self._profile_target()
        shutil.rmtree(target, ignore_errors=True)  # no stale profile from an earlier build
        target.mkdir(parents=True)
        for source in self._profile_sources():
            self.copy_file(str(source), str(target / source.name))

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if getattr(self, "editable_mode", False):
            return outputs
        return [*outputs, *(str(self._profile_target() / f.name) for f in self._profile_sources())]


setup(cmdclass={"build_py": build_py_with_profiles})
