"""The ServerApp (:mod:`~pflarena.server.app`, ``pflarena.server.app:app``) and what a run
does on the server: the round loop (:mod:`~pflarena.server.loop`), checkpoints, results,
cross-evaluation, progress events and their display, metric names and experiment trackers
(results compared and leaderboards: :mod:`pflarena.reporting`)."""
