"""FedPG (docs/methods/fedpg.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side;
- :mod:`.keys`, the message names both sides use;
- :mod:`.params`, its parameters' rules (torch-free).

Its entry point (pyproject.toml): ``fedpg = "pflarena.methods.fedpg.strategy:FedPG"``.
This file imports nothing.
"""
