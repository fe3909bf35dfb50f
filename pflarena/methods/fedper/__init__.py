"""FedPer (docs/methods/fedper.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side;
- :mod:`.params`, its parameters' rules (torch-free).

Its entry point (pyproject.toml): ``fedper = "pflarena.methods.fedper.strategy:FedPer"``.
This file imports nothing.
"""
