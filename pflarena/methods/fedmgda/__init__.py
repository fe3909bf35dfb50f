"""FedMGDA (docs/methods/fedmgda.md): one package, the method's own modules.

- :mod:`.strategy`, the server side.

Its clients run :mod:`pflarena.methods.fedpg.solver` (the declaration names it).

Its entry point (pyproject.toml): ``fedmgda = "pflarena.methods.fedmgda.strategy:FedMGDA"``.
This file imports nothing.
"""
