"""Ditto (docs/methods/ditto.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side.

Its entry point (pyproject.toml): ``ditto = "pflarena.methods.ditto.strategy:Ditto"``.
This file imports nothing.
"""
