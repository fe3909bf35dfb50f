"""FedFomo (docs/methods/fedfomo.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side;
- :mod:`.keys`, the message names both sides use.

Its entry point (pyproject.toml): ``fedfomo = "pflarena.methods.fedfomo.strategy:FedFomo"``.
This file imports nothing.
"""
