"""Clients failing alike are reported once per distinct error, with their count, and an
exchange every client failed stops the run (unless max-failure-fraction=1)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pflarena.server import loop


def _reply(reason: str | None):
    error = None if reason is None else SimpleNamespace(reason=reason)
    return SimpleNamespace(has_error=lambda: error is not None, error=error)


@pytest.fixture
def logged(monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(loop, "log", lambda level, fmt, *args: lines.append(fmt % args))
    return lines


def test_two_thousand_clients_failing_two_ways_give_two_lines_and_stop_the_run(logged):
    messages = [object()] * 2000
    replies = [_reply("cannot split 1797 samples")] * 1500 + [_reply("out of\n memory")] * 500
    with pytest.raises(loop.ClientsFailed) as failed:
        loop.report_client_errors("train", messages, replies)
    assert logged == [
        "pflarena: train failed on 1500 of 2000 clients: cannot split 1797 samples",
        "pflarena: train failed on 500 of 2000 clients: out of memory",
    ]
    assert str(failed.value).startswith("every client failed in train: 1500 of 2000 clients")


def test_one_client_left_or_any_failure_allowed_goes_on(logged):
    replies = [_reply("boom")] * 3 + [_reply(None)]
    loop.report_client_errors("evaluate", [object()] * 4, replies)
    assert logged == ["pflarena: evaluate failed on 3 of 4 clients: boom"]
    loop.report_client_errors("train", [object()] * 2, [_reply("boom")] * 2, stop=False)
    assert len(logged) == 2


def test_many_distinct_errors_are_cut_at_ten_lines(logged):
    replies = [_reply(f"error {i}") for i in range(40)]
    with pytest.raises(loop.ClientsFailed):
        loop.report_client_errors("train", [object()] * 40, replies)
    assert len(logged) == 11 and logged[-1].endswith("... and 30 other errors")
