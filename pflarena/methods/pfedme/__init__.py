"""pFedMe (docs/methods/pfedme.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side;
- :mod:`.keys`, the message names both sides use.

Its entry point (pyproject.toml): ``pfedme = "pflarena.methods.pfedme.strategy:PFedMe"``.
This file imports nothing.
"""
