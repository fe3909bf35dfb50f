"""APFL (docs/methods/apfl.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side;
- :mod:`.keys`, the message names both sides use.

Its entry point (pyproject.toml): ``apfl = "pflarena.methods.apfl.strategy:APFL"``.
This file imports nothing.
"""
