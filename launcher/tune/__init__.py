"""``affrun tune``: the user's own script in short trials under candidate plans, measured by the feed meter:
``command``, ``candidates``, ``session`` (the rounds), ``trial``, ``measure``, ``capture`` (its error line),
``sweep`` (its processes found and killed), ``result`` (table, JSON, chart). docs/tune.md says why."""
