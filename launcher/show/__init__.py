"""``affrun plan``'s table and ``affrun show``'s picture, for people.

One layout in character cells (:mod:`~launcher.show.layout`), built from what the plan means for each core and
GPU (:mod:`~launcher.show.model`) by :mod:`~launcher.show.drawing`, feeds two renderers: the terminal
(:mod:`~launcher.show.terminal`) and SVG (:mod:`~launcher.show.svg`), with the same boxes and the same colours.
The plan table is :mod:`~launcher.show.table`; the live picture of ``affrun show --pid``, :mod:`~launcher.show.live`.
Everything is a pure function of its input; only :func:`write_map` and ``live_svg`` write a file. Standard library only.
"""

from __future__ import annotations

from launcher.show.layout import rank_color
from launcher.show.svg import html_page, svg, write_map
from launcher.show.table import plan_table
from launcher.show.terminal import picture

__all__ = ["html_page", "picture", "plan_table", "rank_color", "svg", "write_map"]
