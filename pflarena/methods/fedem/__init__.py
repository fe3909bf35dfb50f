"""FedEM (docs/methods/fedem.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side;
- :mod:`.keys`, the message names both sides use.

Its entry point (pyproject.toml): ``fedem = "pflarena.methods.fedem.strategy:FedEM"``.
This file imports nothing.
"""
