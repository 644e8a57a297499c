"""``affrun doctor``: find the silent CPU-side starvation of a training job, before launch and while it runs.

- :mod:`launcher.doctor.findings`: the :class:`Finding` record and the catalogue of stable finding ids.
- :mod:`launcher.doctor.facts`: what the checks need to know about the host (runtimes, numactl, Slurm...).
- :mod:`launcher.doctor.checks`: the environment and machine checks, pure functions of (environ, topology, facts).
- :mod:`launcher.doctor.procfs`, :mod:`launcher.doctor.sampling` and :mod:`launcher.doctor.live`: the ``--pid`` audit of a running job (reading, then analysis).
- :mod:`launcher.doctor.thread_homes`, :mod:`launcher.doctor.thread_checks`: every thread against its home.
- :mod:`launcher.doctor.report`: the table and JSON output.

Importing this package (and ``findings``, ``facts``, ``checks``) never imports click, psutil or torch:
``launcher.ensure_affinity`` uses them at the top of training scripts.
"""

from __future__ import annotations
