"""The maths more than one method uses, in one place each, imported by both sides.

- :mod:`.ddpg`: the DDPG agent of PAGE's server and clients and of Dap-FL's clients.
- :mod:`.mgda`: the min-norm common descent direction (a QP on the simplex) of FedPG,
  FedMGDA and CFL.
- :mod:`.canonical`: K copies of part of a model on a shared trunk, and their per-client
  combinations: PPFL's canonical models, FedEM's components, IFCA's and CFL's clusters.
- :mod:`.heads`: running and re-initialising a model's head apart from its body (Fed-RoD,
  FedRecon, SplitGP).

A module here imports only :mod:`pflarena.core`; maths one method alone uses lives in that
method's package (``pflarena/methods/<name>/``).
"""
