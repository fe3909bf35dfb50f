"""LG-FedAvg (docs/methods/lgfedavg.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side;
- :mod:`.params`, its parameters' rules (torch-free).

Its entry point (pyproject.toml): ``lgfedavg = "pflarena.methods.lgfedavg.strategy:LGFedAvg"``.
This file imports nothing.
"""
