"""FedAvg (docs/methods/fedavg.md): one package, the method's own modules.

- :mod:`.strategy`, the server side;
- :mod:`.solver`, the client side;
- :mod:`.partial`, FedAvg over part of the model, the server side FedPer, FedRep, FedBABU, LG-FedAvg and FedRecon extend.

Its entry point (pyproject.toml): ``fedavg = "pflarena.methods.fedavg.strategy:FedAvg"``.
This file imports nothing.
"""
