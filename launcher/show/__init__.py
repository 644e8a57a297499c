"""``affrun plan``'s table (``table``) and ``affrun show``'s pictures: one layout in character cells (``layout``),
drawn from the plan's meaning of each core and GPU (``model``, ``drawing``; ``live`` for ``--pid``), rendered for a
terminal (``terminal``) and as SVG (``svg``). Pure, standard library only; the package imports none of its modules.
"""
