"""``affrun plan``'s table and ``affrun show``'s picture, for people.

One layout in character cells (:mod:`~launcher.show.layout`), built from what the plan means for each core and
GPU (:mod:`~launcher.show.model`) by :mod:`~launcher.show.drawing`, feeds two renderers: the terminal
(:mod:`~launcher.show.terminal`) and SVG (:mod:`~launcher.show.svg`), with the same boxes and the same colours.
The plan table is :mod:`~launcher.show.table`; the live picture of ``affrun show --pid``, :mod:`~launcher.show.live`.
Everything is a pure function of its input: nothing here writes a file. Standard library only. The package
imports none of its modules: ``affrun plan --json`` needs the table's thread plans only, not the picture.
"""
