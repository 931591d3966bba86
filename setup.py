"""Ship the template bundle inside the wheel.

``packer/``, ``ansible/``, ``templates/``, ``cloud-init/`` and ``config/`` stay at the top of the repository (the
design's layout); a built wheel carries a copy of them as ``imagebuilder/_bundle/``, which
:mod:`imagebuilder.core.paths` finds when the package is not run from a checkout. Everything else is in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

BUNDLE = ("packer", "ansible", "templates", "cloud-init", "config")
HERE = Path(__file__).resolve().parent


class BuildWithBundle(build_py):  # type: ignore[misc]
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return  # an editable install reads the checkout itself
        target = Path(self.build_lib) / "imagebuilder" / "_bundle"
        shutil.rmtree(target, ignore_errors=True)
        for name in BUNDLE:
            shutil.copytree(HERE / name, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))


setup(cmdclass={"build_py": BuildWithBundle})
