"""FedALA (docs/methods/fedala.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side;
- :mod:`.keys`, the message names both sides use.

Its entry point (pyproject.toml): ``fedala = "pflarena.methods.fedala.strategy:FedALA"``.
This file imports nothing.
"""
