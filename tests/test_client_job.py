"""A client's per-message costs kept low without changing a result: the global model tested
once per push, and torch seeded for the client's device alone."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, RecordDict
from helpers import config

from pflarena.client import job as job_module
from pflarena.client.app import seed_torch
from pflarena.client.job import ClientJob, load_node_data
from pflarena.client.state import ClientState
from pflarena.core import keys
from pflarena.core.versions import MemoryVersions
from pflarena.runtime.parcel import copy_message


def _job(cfg, partition: int, record: ArrayRecord) -> ClientJob:
    device = torch.device("cpu")
    node = {"partition-id": partition, "num-partitions": cfg.num_clients}
    state = ClientState(MemoryVersions(RecordDict()), None, None, prune=False)
    content = RecordDict({keys.ARRAYS: record})
    return ClientJob(cfg, load_node_data(cfg, node, device), state, content, device)


def _shifted(job: ClientJob, by: float) -> ArrayRecord:
    model = job.new_model()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(by)
    return ArrayRecord(model.state_dict())


def test_the_global_model_is_tested_once_built_for_a_pushs_messages(monkeypatch) -> None:
    """Catches a kept model used for another record (a new round's model, or the same
    values in other bytes), a result that differs from testing a model of one's own, and a
    kept model a solver could train."""
    from test_parcel import _message

    cfg = config(strategy="fedavg", model="small-cnn-bn")
    monkeypatch.setattr(job_module, "_TESTED", {})
    built = []
    real = ClientJob.model_from

    def counted(self, arrays):
        built.append(1)
        return real(self, arrays)

    monkeypatch.setattr(ClientJob, "model_from", counted)
    first = _job(cfg, 0, ArrayRecord())
    record = _shifted(first, 0.01)
    # one push: every client's message a copy sharing the record's bytes
    sent = _message(RecordDict({keys.ARRAYS: record}))
    jobs = [_job(cfg, c, copy_message(sent).content[keys.ARRAYS]) for c in range(3)]
    results = [job.test_global() for job in jobs]
    assert len(built) == 1
    for job, result in zip(jobs, results, strict=True):
        assert result == job.test(real(job, job.arrays))
    # the same values in bytes of their own (another push) and another round's model
    again = _job(cfg, 1, ArrayRecord(dict(record.to_torch_state_dict())))
    assert again.test_global() == results[1] and len(built) == 2
    moved = _job(cfg, 1, _shifted(first, 0.02))
    assert moved.test_global() == moved.test(real(moved, moved.arrays)) and len(built) == 3
    kept = job_module._TESTED["global"][2]
    assert not any(p.requires_grad for p in kept.parameters())


def test_a_global_test_without_the_servers_model_says_so() -> None:
    job = _job(config(strategy="fedavg"), 0, ArrayRecord())
    with pytest.raises(RuntimeError, match="needs the server's model"):
        job.test_global()


def test_seeding_for_the_cpu_draws_what_torch_manual_seed_draws() -> None:
    seed = 2**64 - 12345  # a 64-bit seed, as ClientJob.seed gives
    torch.manual_seed(seed)
    expected = (torch.rand(5), torch.randn(3), torch.randint(0, 100, (4,)))
    torch.manual_seed(0)
    seed_torch(seed, torch.device("cpu"))
    drawn = (torch.rand(5), torch.randn(3), torch.randint(0, 100, (4,)))
    assert all(torch.equal(a, b) for a, b in zip(expected, drawn, strict=True))
