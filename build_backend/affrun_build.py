"""affrun's PEP 517 build backend: setuptools' own, plus ``affrun-startup.pth`` and ``_affrun_startup.py`` added at
the top of every wheel it builds, regular and editable, and listed in its ``RECORD``; in an editable wheel
``_affrun_startup.py`` names the source tree's package (``PACKAGE_DIR``). Why: docs/design.md §11.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (every other hook unchanged)

HERE = os.path.dirname(os.path.abspath(__file__))
PTH_NAME = "affrun-startup.pth"
PTH_SOURCE = os.path.join(HERE, PTH_NAME)
MODULE_NAME = "_affrun_startup.py"
MODULE_SOURCE = os.path.join(HERE, MODULE_NAME)
# The source tree's package, for editable wheels: build_backend/ sits beside launcher/.
SOURCE_PACKAGE = os.path.join(os.path.dirname(HERE), "launcher")
PACKAGE_DIR_LINE = b"PACKAGE_DIR: str | None = None\n"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def startup_module(package_dir: str | None = None, source: str = MODULE_SOURCE) -> bytes:
    """``_affrun_startup.py`` as a wheel carries it: with ``package_dir`` (an editable wheel's source package)
    written into its ``PACKAGE_DIR``, or as it is (the package lies beside it)."""
    with open(source, "rb") as fh:
        data = fh.read()
    if package_dir is None:
        return data
    if data.count(PACKAGE_DIR_LINE) != 1:
        raise RuntimeError(f"{source}: expected one line {PACKAGE_DIR_LINE!r}")
    return data.replace(PACKAGE_DIR_LINE, f"PACKAGE_DIR: str | None = {os.path.abspath(package_dir)!r}\n".encode())


def add_startup_hook(wheel_path: str, pth_source: str = PTH_SOURCE, package_dir: str | None = None) -> None:
    """Add ``affrun-startup.pth`` and ``_affrun_startup.py`` (:func:`startup_module` of ``package_dir``) at the
    top of the wheel at ``wheel_path`` and list them in its RECORD."""
    with open(pth_source, "rb") as fh:
        added = {PTH_NAME: fh.read(), MODULE_NAME: startup_module(package_dir)}
    tmp = wheel_path + ".tmp"
    with zipfile.ZipFile(wheel_path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        records = [n for n in src.namelist() if n.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise RuntimeError(f"{wheel_path}: expected one .dist-info/RECORD, found {len(records)}")
        for item in src.infolist():
            if item.filename != records[0] and item.filename not in added:
                dst.writestr(item, src.read(item.filename))
        for name, data in added.items():
            dst.writestr(name, data)
        lines = [ln for ln in src.read(records[0]).decode().splitlines()
                 if ln and ln.split(",", 1)[0] not in added]
        at = len(lines) - 1 if lines and lines[-1].startswith(records[0] + ",") else len(lines)
        lines[at:at] = [_record_line(name, data) for name, data in added.items()]
        dst.writestr(records[0], "\n".join(lines) + "\n")
    os.replace(tmp, wheel_path)


def build_wheel(wheel_directory: str, config_settings: dict[str, Any] | None = None,
                metadata_directory: str | None = None) -> str:
    name: str = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    add_startup_hook(os.path.join(wheel_directory, name))
    return name


def build_editable(wheel_directory: str, config_settings: dict[str, Any] | None = None,
                   metadata_directory: str | None = None) -> str:
    name: str = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    add_startup_hook(os.path.join(wheel_directory, name), package_dir=SOURCE_PACKAGE)
    return name
