"""FedAvg-FT (docs/methods/fedavg-ft.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side.

Its entry point (pyproject.toml): ``fedavg-ft = "pflarena.methods.fedavg_ft.strategy:FedAvgFT"``.
This file imports nothing.
"""
