"""``affrun tune``: the user's own script in short trials under candidate plans, measured by the feed meter.

``command`` (the command line), ``candidates`` (which plans, the pruning rule), ``session`` (the rounds, the
budget, the stopping signals), ``trial`` (one trial), ``measure`` (its figures), ``capture`` (its error line),
``sweep`` (its processes found and killed), ``result`` (the table, JSON and chart). docs/tune.md says why.
"""
