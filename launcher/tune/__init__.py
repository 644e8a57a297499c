"""``affrun tune``: the user's own script in short trials under candidate plans, measured by the feed meter.

``candidates`` (which plans, and when a family is pruned: pure), ``measure`` (one trial's figures from the meter's
JSON: pure), ``trial`` (one trial as a session of its own, started, watched and stopped), ``sweep`` (every process
of a trial found and killed: tune as a child subreaper), ``capture`` (the line of a trial's output that names its
error, in bounded memory), ``signals`` (Ctrl-C and SIGTERM noted, never raised), ``session`` (the rounds, the budget, Ctrl-C), ``result``
(the table, the best, the JSON), ``chart`` (the SVG, with ``affrun show``'s drawing code), ``command`` (tune's own
options beside affrun torchrun's). docs/tune.md says why each choice is made.
"""
