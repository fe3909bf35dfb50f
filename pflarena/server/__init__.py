"""The ServerApp (:mod:`~pflarena.server.app`, ``pflarena.server.app:app``) and what a run
does on the server: the round loop (:mod:`~pflarena.server.loop`), checkpoints, results and
their comparison, cross-evaluation, progress lines, metric names and experiment trackers."""
