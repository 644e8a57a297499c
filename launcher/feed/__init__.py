"""The feed meter (``--feed-report``): how long a rank's training loop waits for its DataLoader.

``meter`` runs in the rank (installed by the startup hook, standard library only once loaded), ``workers`` is the
plan's DataLoader worker suggestion, ``variables`` the parent's side (the ``AFFRUN_FEED*`` variables) and
``figures`` reads what the ranks wrote (``affrun doctor --pid``, ``affrun tune``). docs/tune.md explains it.
"""
