"""CFL (docs/methods/cfl.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side;
- :mod:`.keys`, the message names both sides use.

Its entry point (pyproject.toml): ``cfl = "pflarena.methods.cfl.strategy:CFL"``.
This file imports nothing.
"""
