"""Reading runs' results back for a researcher: ``pflarena compare``'s table
(:mod:`~pflarena.reporting.compare`), a sweep's leaderboard
(:mod:`~pflarena.reporting.leaderboard`) and their pictures (:mod:`~pflarena.reporting.plots`).

Above ``server`` in the layering: it reads the files a run writes
(:mod:`pflarena.server.results`) and names figures as :mod:`pflarena.server.metrics` does;
nothing below imports it.
"""
