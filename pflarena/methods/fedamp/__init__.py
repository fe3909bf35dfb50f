"""FedAMP (docs/methods/fedamp.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side.

Its entry point (pyproject.toml): ``fedamp = "pflarena.methods.fedamp.strategy:FedAMP"``.
This file imports nothing.
"""
