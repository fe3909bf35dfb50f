"""FedRecon (docs/methods/fedrecon.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side;
- :mod:`.params`, its parameters' rules (torch-free).

Its entry point (pyproject.toml): ``fedrecon = "pflarena.methods.fedrecon.strategy:FedRecon"``.
This file imports nothing.
"""
