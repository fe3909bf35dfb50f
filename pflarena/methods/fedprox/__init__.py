"""FedProx (docs/methods/fedprox.md): one package, the method's own modules.

- :mod:`.strategy`, the server side.

Its clients run :mod:`pflarena.methods.fedavg.solver` (the declaration names it).

Its entry point (pyproject.toml): ``fedprox = "pflarena.methods.fedprox.strategy:FedProx"``.
This file imports nothing.
"""
