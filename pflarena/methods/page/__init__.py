"""PAGE (docs/methods/page.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side;
- :mod:`.keys`, the message names both sides use;
- :mod:`.params`, its parameters' rules (torch-free);
- :mod:`.utility`, the players' utility (the reciprocal of a loss) both sides reward with.

Its entry point (pyproject.toml): ``page = "pflarena.methods.page.strategy:Page"``.
This file imports nothing.
"""
