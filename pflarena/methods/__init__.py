"""The methods, one package each: ``pflarena/methods/<name>/`` holds everything one method
is, and nothing another method needs.

- ``strategy.py``: the server side, a :class:`~pflarena.strategies.base.PflStrategy` subclass
  carrying the method's :class:`~pflarena.core.methods.MethodDeclaration`; pyproject.toml's
  ``pflarena.methods`` entry point names it;
- ``solver.py``: the client side, ``train(job)`` and ``evaluate(job)``; the declaration
  names it, and a client loads no other module of this package as a solver;
- ``keys.py``: the message names only this method uses (the shared ones:
  :mod:`pflarena.core.keys`);
- ``params.py``: the parameters whose rules go beyond their types and bounds, torch-free,
  so that the command checks a run config against them before anything imports torch or
  Flower (:func:`pflarena.cli.options.validate_run`, found through the catalog
  ``methods/catalog.json``);
- the maths only this method uses, in modules of their own.

The layering (tests/test_layers.py): a package imports :mod:`pflarena.core`,
:mod:`pflarena.algorithms` (maths several methods share), the strategies' base and the
client's helpers; a solver, and every module it reaches, imports no strategy (an edge image
holds only what its ClientApp needs); a method may extend another's strategy (most extend
:class:`~pflarena.methods.fedavg.strategy.FedAvg`). Each ``__init__.py`` imports nothing.
"""
