"""FedRep (docs/methods/fedrep.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side;
- :mod:`.params`, its parameters' rules (torch-free).

Its entry point (pyproject.toml): ``fedrep = "pflarena.methods.fedrep.strategy:FedRep"``.
This file imports nothing.
"""
