"""Deployments: a SuperLink and SuperNodes as processes on one machine
(:mod:`~pflarena.deploy.local`), docker compose files (:mod:`~pflarena.deploy.compose`) and
their images (:mod:`~pflarena.deploy.images`), and the SuperNode side: the warm ClientApp
executor (:mod:`~pflarena.deploy.executor`) and the SuperNode wrapper
(:mod:`~pflarena.deploy.supernode`)."""
