"""FedBABU (docs/methods/fedbabu.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side;
- :mod:`.params`, its parameters' rules (torch-free).

Its entry point (pyproject.toml): ``fedbabu = "pflarena.methods.fedbabu.strategy:FedBABU"``.
This file imports nothing.
"""
