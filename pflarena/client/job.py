"""What a local solver gets for one message: this client's data, state and instructions."""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from functools import cached_property, lru_cache

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from torch import nn

from pflarena.client.state import ClientState
from pflarena.core import keys
from pflarena.core.array_decoding import state_record, torch_state
from pflarena.core.config import RunConfig
from pflarena.core.datasets import DatasetInfo, to_tensors
from pflarena.core.federation import ClientData, load_client
from pflarena.core.models import build_model, default_model_for
from pflarena.core.seeds import derive_seed
from pflarena.core.shard_format import load_shard, load_shard_client, read_shard_set
from pflarena.core.training import EvalResult, evaluate

__all__ = ["ClientJob", "NodeData", "load_node_data", "pick_device"]


@dataclass(frozen=True)
class NodeData:
    """A client's train, test and validation splits as tensors on its device.

    The validation split is empty unless the run sets ``validation-fraction``.
    """

    client_id: int
    info: DatasetInfo
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor


def pick_device(preference: str = "auto") -> torch.device:
    """CUDA when available (or asked for), else CPU."""
    if preference == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda was asked for, but CUDA is not available on this node")
    if preference == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")


def _to_node_data(data: ClientData, info: DatasetInfo, device: torch.device) -> NodeData:
    x_train, y_train = to_tensors(data.x_train, data.y_train, info)
    x_test, y_test = to_tensors(data.x_test, data.y_test, info)
    x_val, y_val = to_tensors(data.x_val, data.y_val, info)
    return NodeData(
        client_id=data.client_id,
        info=info,
        x_train=x_train.to(device),
        y_train=y_train.to(device),
        x_test=x_test.to(device),
        y_test=y_test.to(device),
        x_val=x_val.to(device),
        y_val=y_val.to(device),
    )


@lru_cache(maxsize=8)
def _load_shard_cached(path: str, device: str) -> NodeData:
    data, info = load_shard(path)
    return _to_node_data(data, info, torch.device(device))


@lru_cache(maxsize=64)
def _load_partition_cached(cfg: RunConfig, partition_id: int, device: str) -> NodeData:
    data, info = load_client(cfg.federation_spec(), partition_id)
    return _to_node_data(data, info, torch.device(device))


@lru_cache(maxsize=64)
def _load_shard_dir_cached(directory: str, client_id: int, stamp: int, device: str) -> NodeData:
    # ``stamp`` (the file's mtime) keys the cache: a rewritten directory is read again
    data, info = load_shard_client(directory, client_id)
    return _to_node_data(data, info, torch.device(device))


def load_node_data(cfg: RunConfig, node_config: dict, device: torch.device) -> NodeData:
    """This node's data: the shard named by ``data-path``, else partition ``partition-id``.

    In deployment each SuperNode is started with ``--node-config 'data-path="..."'`` and trains
    on that file alone. In simulation Flower sets ``partition-id``: with ``shards-dir`` the
    node reads that client's file of the directory, otherwise the partition is rebuilt
    deterministically from the run config (both cached per process).
    """
    data_path = node_config.get("data-path")
    if data_path:
        return _load_shard_cached(str(data_path), str(device))
    if "partition-id" not in node_config:
        raise RuntimeError(
            "this node has neither a 'data-path' nor a 'partition-id' in its node config; "
            "start the SuperNode with --node-config 'data-path=\"/path/to/client_0000.npz\"'"
        )
    partition_id = int(node_config["partition-id"])
    num_partitions = int(node_config.get("num-partitions", cfg.num_clients))
    if num_partitions != cfg.num_clients:
        raise RuntimeError(
            f"the federation has {num_partitions} simulated nodes but the run config says "
            f"num-clients={cfg.num_clients}; make them equal (pflarena run does this for you, "
            'with flwr run pass --federation-config "num-supernodes=N")'
        )
    if cfg.shards_dir:
        stamp = read_shard_set(cfg.shards_dir).path(partition_id).stat().st_mtime_ns
        return _load_shard_dir_cached(cfg.shards_dir, partition_id, stamp, str(device))
    return _load_partition_cached(cfg, partition_id, str(device))


def node_model_name(cfg: RunConfig, info: DatasetInfo) -> str:
    """The model a node builds for data described by ``info``: ``model`` if the run sets it,
    else that data's default (what ``cfg.model_name()`` gives where ``info`` is the run's)."""
    return cfg.model or default_model_for(info.name, info)


@lru_cache(maxsize=4)
def _initial_model(
    name: str, input_shape: tuple, num_classes: int, seed: int, device: str
) -> nn.Module:
    # Seeded initialisation costs more than copying; clients copy this template, kept on
    # their device (a GPU's copy is made there, not sent from the host per message).
    return build_model(name, input_shape, num_classes, seed=seed).to(device)


@lru_cache(maxsize=4)
def _skeleton(template: nn.Module) -> tuple[nn.Module, dict[str, torch.dtype]]:
    """``template`` without its values (on torch's ``meta`` device), and the dtype of each
    of its state entries: a model to fill with another state's tensors."""
    return copy.deepcopy(template).to("meta"), {
        name: value.dtype for name, value in template.state_dict().items()
    }


@dataclass
class ClientJob:
    """Everything a solver needs to answer one train or evaluate message."""

    cfg: RunConfig
    data: NodeData
    state: ClientState
    content: RecordDict
    device: torch.device

    @cached_property
    def config(self) -> ConfigRecord:
        """The message's ConfigRecord (empty if it has none). Kept: Flower's
        ``RecordDict.config_records`` builds a new mapping on every access, which a solver
        reading a dozen settings (``param``) paid ~0.3 ms a time for."""
        return self.content.config_records.get(keys.CONFIG, ConfigRecord())

    @property
    def arrays(self) -> ArrayRecord | None:
        """The server's model sent with the message, if any."""
        return self.content.array_records.get(keys.ARRAYS)

    @property
    def client_id(self) -> int:
        return self.data.client_id

    @property
    def server_round(self) -> int:
        return int(self.config.get(keys.SERVER_ROUND, 0))

    @property
    def method(self) -> str:
        return str(self.config.get(keys.METHOD, self.cfg.strategy))

    @property
    def phase(self) -> str:
        """Which exchange of a round this message belongs to (``train`` unless named)."""
        return str(self.config.get(keys.PHASE, keys.PHASE_TRAIN))

    def param(self, key: str):
        """A method value the strategy sent under ``<method>.<key>`` (``method_config``)."""
        name = f"{self.method}.{key}"
        if name not in self.config:
            raise KeyError(f"the message has no {name!r}; the strategy must send it")
        return self.config[name]

    def new_model(self) -> nn.Module:
        """The run's initial model (the same weights on every client and the server).

        Its kind follows the data this node holds (:func:`node_model_name`), not
        ``cfg.model_name()``, which reads ``shards-dir``'s manifest: in a deployment that
        directory is the server's (the compose files mount it in the ServerApp's container
        only), and a node has its own shard file."""
        return copy.deepcopy(self._template())

    def _template(self) -> nn.Module:
        info = self.data.info
        return _initial_model(
            node_model_name(self.cfg, info),
            tuple(info.input_shape),
            info.num_classes,
            self.cfg.seed,
            str(self.device),
        )

    def model_from(self, arrays: ArrayRecord) -> nn.Module:
        """A model loaded with ``arrays`` (a state_dict as an ArrayRecord), each entry in
        the model's own dtype (a float16 state entry comes back float32).

        The decoded tensors become the model's (``load_state_dict(assign=True)`` into a
        skeleton on torch's ``meta`` device): no copy of the initial model's values to
        overwrite, half the time of a copy then a load (1.7 ms against 3.2 ms for MNIST's
        CNN, 6.6 MB). A model whose every value is not in its state (a buffer that is not
        persistent) is copied and loaded instead."""
        skeleton, dtypes = _skeleton(self._template())
        state = torch_state(arrays, self.device)
        if set(state) == set(dtypes):  # otherwise load_state_dict's error names the difference
            model = copy.deepcopy(skeleton)
            model.load_state_dict(
                {name: value.to(dtypes[name]) for name, value in state.items()}, assign=True
            )
            if not any(t.is_meta for t in itertools.chain(model.parameters(), model.buffers())):
                return model
        model = self.new_model()
        model.load_state_dict(state)
        return model

    def global_model(self) -> nn.Module:
        if self.arrays is None or not len(self.arrays):
            raise RuntimeError(f"method {self.config.get(keys.METHOD)!r} needs the server's model")
        return self.model_from(self.arrays)

    def load_state_model(self, key: str) -> nn.Module | None:
        """The model saved in this client's persistent state under ``key``, if any."""
        record = self.state.get(key)
        return None if record is None else self.model_from(record)

    def state_model_or_initial(self, key: str) -> nn.Module:
        """The model saved under ``key``; on first use the run's initial model.

        A client whose accepted state is gone (``state.missing``) starts from the server's
        current model where the message carries one.
        """
        model = self.load_state_model(key)
        if model is not None:
            return model
        if self.state.missing and self.arrays is not None and len(self.arrays):
            return self.global_model()
        return self.new_model()

    def save_state_model(self, key: str, model: nn.Module) -> None:
        """Keep ``model`` in this client's state under ``key``: its float32 entries in the
        run's ``state-precision`` (``load_state_dict`` casts them back to the model's)."""
        state = model.state_dict()
        if self.cfg.state_precision == "float16":
            state = {
                name: value.half() if value.dtype == torch.float32 else value
                for name, value in state.items()
            }
        self.state[key] = state_record(state)

    def seed(self, purpose: str, server_round: int | None = None) -> int:
        """A 64-bit seed derived from (run seed, client, round, purpose); the message's
        round unless ``server_round`` names another (work of an earlier round done now)."""
        round_ = self.server_round if server_round is None else server_round
        return derive_seed(self.cfg.seed, self.client_id, round_, purpose)

    def generator(self, purpose: str, server_round: int | None = None) -> torch.Generator:
        """A CPU generator seeded by (run seed, client, round, purpose), for batch order."""
        return torch.Generator().manual_seed(self.seed(purpose, server_round))

    def train_kwargs(self) -> dict:
        """SGD hyperparameters from the message config."""
        return {
            "epochs": int(self.config[keys.LOCAL_EPOCHS]),
            "batch_size": int(self.config[keys.BATCH_SIZE]),
            "lr": float(self.config[keys.LR]),
            "momentum": float(self.config.get(keys.MOMENTUM, 0.0)),
            "weight_decay": float(self.config.get(keys.WEIGHT_DECAY, 0.0)),
        }

    def test(self, model: nn.Module) -> EvalResult:
        return evaluate(model, self.data.x_test, self.data.y_test)

    def test_global(self) -> EvalResult:
        """The server's model (:meth:`global_model`) tested on this client's test split.

        The model is built once for all the messages a process gets that carry the same
        arrays: the messages of one push share their arrays' bytes (one record sent to every
        client: :mod:`pflarena.runtime.parcel`), so an evaluation round builds the global model
        once per worker, not once per client. The kept model's parameters require no
        gradient: a solver that trained it would fail, not change the next client's model."""
        arrays = self.arrays
        if arrays is None or not len(arrays):
            return self.test(self.global_model())  # its error names what is missing
        datas = tuple(array.data for array in arrays.values())
        template = self._template()
        held = _TESTED.get("global")
        if (
            held is None
            or held[1] is not template
            or len(held[0]) != len(datas)
            or any(mine is not theirs for mine, theirs in zip(held[0], datas, strict=True))
        ):
            model = self.model_from(arrays).requires_grad_(False)
            # the bytes are held with the model: while kept, no other object takes their ids
            held = _TESTED["global"] = (datas, template, model)
        return self.test(held[2])


#: The server's model this process last tested (:meth:`ClientJob.test_global`): the bytes it
#: was built from, the template it was built on, and the model.
_TESTED: dict[str, tuple[tuple[bytes, ...], nn.Module, nn.Module]] = {}
