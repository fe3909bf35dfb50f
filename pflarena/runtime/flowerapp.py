"""A Flower App directory as the runtimes use it: its components and identity, its run
config as Flower parses it, and its ClientApp loaded as Flower's simulation engine loads it.

Shared by the Ray runtime (:mod:`pflarena.runtime.simulation`) and the in-process one
(:mod:`pflarena.runtime.inprocess`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

__all__ = ["FlowerApp", "flower_overrides", "load_client_app", "module_of"]


@dataclass(frozen=True)
class FlowerApp:
    """A Flower App directory: its components and identity, from its ``pyproject.toml``."""

    root: Path
    server_app_attr: str
    client_app_attr: str
    fab_id: str
    fab_version: str

    @classmethod
    def from_dir(cls, root: Path) -> FlowerApp:
        """Read ``root/pyproject.toml`` (the FAB id is ``<publisher>/<name>``, as Flower's
        ``get_metadata_from_config`` makes it)."""
        project = tomllib.loads((root / "pyproject.toml").read_text())
        app = project["tool"]["flwr"]["app"]
        return cls(
            root=root.resolve(),
            server_app_attr=app["components"]["serverapp"],
            client_app_attr=app["components"]["clientapp"],
            fab_id=f"{app['publisher']}/{project['project']['name']}",
            fab_version=project["project"]["version"],
        )


def flower_overrides(run_config: dict[str, Any], scratch: Path) -> dict[str, Any]:
    """``run_config`` as Flower's ``flwr run --run-config FILE`` hands it to the SuperLink.

    The keys are written to a TOML file and read back by Flower's own parser
    (``flwr.common.config.parse_config_args``), so values get the types they get there.
    """
    from flwr.common.config import parse_config_args

    from pflarena.core.config import toml_value

    scratch.mkdir(parents=True, exist_ok=True)
    path = scratch / "run-config.toml"
    path.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in run_config.items()))
    return parse_config_args([str(path)])


def module_of(attr: str) -> str:
    return attr.split(":", 1)[0]


def load_client_app(app: FlowerApp) -> Any:
    """The ClientApp object, loaded the way Flower's simulation engine loads it."""
    from flwr.clientapp.utils import get_load_client_app_fn

    return get_load_client_app_fn(
        default_app_ref=app.client_app_attr, app_path=str(app.root), multi_app=False
    )(app.fab_id, app.fab_version, "")
