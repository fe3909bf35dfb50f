"""Per-FedAvg (docs/methods/perfedavg.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side.

Its entry point (pyproject.toml): ``perfedavg = "pflarena.methods.perfedavg.strategy:PerFedAvg"``.
This file imports nothing.
"""
