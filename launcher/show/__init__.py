"""``affrun plan``'s table and ``affrun show``'s picture, for people.

One layout in character cells (:mod:`~launcher.show.layout`), built from what the plan means for each core and
GPU (:mod:`~launcher.show.model`) by :mod:`~launcher.show.drawing`, feeds two renderers: the terminal
(:mod:`~launcher.show.terminal`) and SVG (:mod:`~launcher.show.svg`), with the same boxes and the same colours.
The plan table is :mod:`~launcher.show.table`; the live picture of ``affrun show --pid``, :mod:`~launcher.show.live`.
Everything is a pure function of its input: nothing here writes a file. Standard library only.
"""

from __future__ import annotations

from launcher.show.layout import rank_color
from launcher.show.svg import html_page, map_document, svg
from launcher.show.table import plan_table
from launcher.show.terminal import picture

__all__ = ["html_page", "map_document", "picture", "plan_table", "rank_color", "svg"]
