"""IFCA (docs/methods/ifca.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side;
- :mod:`.keys`, the message names both sides use.

Its entry point (pyproject.toml): ``ifca = "pflarena.methods.ifca.strategy:IFCA"``.
This file imports nothing.
"""
