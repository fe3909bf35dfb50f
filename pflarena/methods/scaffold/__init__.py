"""SCAFFOLD (docs/methods/scaffold.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side;
- :mod:`.keys`, the message names both sides use.

Its entry point (pyproject.toml): ``scaffold = "pflarena.methods.scaffold.strategy:Scaffold"``.
This file imports nothing.
"""
