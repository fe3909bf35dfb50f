"""FedDyn (docs/methods/feddyn.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side.

Its entry point (pyproject.toml): ``feddyn = "pflarena.methods.feddyn.strategy:FedDyn"``.
This file imports nothing.
"""
