"""pFedSV (docs/methods/pfedsv.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side;
- :mod:`.keys`, the message names both sides use;
- :mod:`.shapley`, Shapley values by exact enumeration or permutation sampling.

Its entry point (pyproject.toml): ``pfedsv = "pflarena.methods.pfedsv.strategy:PFedSV"``.
This file imports nothing.
"""
