"""affrun's PEP 517 build backend: setuptools' own, plus the startup hook ``affrun-startup.pth`` at the top of
every wheel it builds, regular and editable alike.

Python's ``site`` runs the one line of each ``.pth`` file in site-packages at every interpreter start (coverage.py
measures subprocesses this way); affrun's line binds a process to its rank under ``affrun run`` and does nothing
elsewhere. setuptools has no option to put a file at the top of site-packages, and its editable wheels leave out
what a custom ``build_py`` copies there (the lenient strategy maps packages only). So the finished wheel is
rewritten instead: the file is added and listed in ``RECORD`` with its hash and size, as the wheel format asks.
This uses only the PEP 517 hooks and the wheel format, no setuptools internals.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (every other hook unchanged)

PTH_NAME = "affrun-startup.pth"
PTH_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), PTH_NAME)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def add_startup_hook(wheel_path: str, pth_source: str = PTH_SOURCE) -> None:
    """Add ``affrun-startup.pth`` at the top of the wheel at ``wheel_path`` and list it in its RECORD."""
    with open(pth_source, "rb") as fh:
        pth = fh.read()
    tmp = wheel_path + ".tmp"
    with zipfile.ZipFile(wheel_path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        records = [n for n in src.namelist() if n.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise RuntimeError(f"{wheel_path}: expected one .dist-info/RECORD, found {len(records)}")
        for item in src.infolist():
            if item.filename not in (records[0], PTH_NAME):
                dst.writestr(item, src.read(item.filename))
        dst.writestr(PTH_NAME, pth)
        lines = [ln for ln in src.read(records[0]).decode().splitlines() if ln and not ln.startswith(PTH_NAME + ",")]
        lines.insert(len(lines) - 1 if lines and lines[-1].startswith(records[0] + ",") else len(lines),
                     _record_line(PTH_NAME, pth))
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
    add_startup_hook(os.path.join(wheel_directory, name))
    return name
