"""``affrun doctor``: the CPU-side starvation of a training job, before launch (``diagnose``) and while it runs
(``sampling``). docs/doctor.md. Importing ``findings``, ``facts`` and ``diagnose`` imports no click or torch."""
