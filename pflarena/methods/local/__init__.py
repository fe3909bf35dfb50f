"""Local (docs/methods/local.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side.

Its entry point (pyproject.toml): ``local = "pflarena.methods.local.strategy:Local"``.
This file imports nothing.
"""
