"""pFedHN (docs/methods/pfedhn.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side.

Its entry point (pyproject.toml): ``pfedhn = "pflarena.methods.pfedhn.strategy:PFedHN"``.
This file imports nothing.
"""
