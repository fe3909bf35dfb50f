"""PPFL (docs/methods/ppfl.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side;
- :mod:`.keys`, the message names both sides use;
- :mod:`.params`, its parameters' rules (torch-free);
- :mod:`.population`, memberships on the simplex, the affinity graph and its Laplacian.

Its entry point (pyproject.toml): ``ppfl = "pflarena.methods.ppfl.strategy:PPFL"``.
This file imports nothing.
"""
