"""The in-process Grid of fast tests: no SuperLink, no Ray, the real ClientApp.

:class:`pflarena.server.inprocess.InProcessGrid` keeping every message it sends (``sent``),
so tests can assert what went down; ``offline`` and ``reply_filter`` simulate dead nodes
and tampered replies.
"""

from __future__ import annotations

from flwr.clientapp import ClientApp

from pflarena.server.inprocess import InProcessGrid


class LocalGrid(InProcessGrid):
    def __init__(
        self,
        client_app: ClientApp,
        run_config: dict,
        num_nodes: int,
        *,
        node_configs: list[dict] | None = None,
        node_id_base: int = 1_000_003,
    ) -> None:
        super().__init__(
            client_app,
            run_config,
            num_nodes,
            node_configs=node_configs,
            node_id_base=node_id_base,
            keep_sent=True,
        )
