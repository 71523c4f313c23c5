"""The plumbing shared by the framework adapters: counters, failed hooks, failed fields."""

from __future__ import annotations

import logging
import re
import threading

import pytest

from boltrl.adapter_support import Counters, jsonable, new_id

LOG = logging.getLogger("boltrl_test_adapter")


def test_counters_count_per_key_from_many_threads() -> None:
    c = Counters("boltrl_test", LOG, "calls", "tool_steps")
    assert c.snapshot() == {"calls": 0, "tool_steps": 0, "failures": 0, "field_failures": 0}

    def bump() -> None:
        for _ in range(1000):
            c.count("calls")

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c.count("tool_steps")
    snap = c.snapshot()
    assert snap == {"calls": 4000, "tool_steps": 1, "failures": 0, "field_failures": 0}
    snap["calls"] = 0  # a copy: changing it changes nothing
    assert c.snapshot()["calls"] == 4000


def test_failed_counts_and_logs_the_exception(caplog: pytest.LogCaptureFixture) -> None:
    c = Counters("boltrl_test", LOG)
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        try:
            raise ValueError("odd span")
        except ValueError:
            c.failed("on_span_end")
    assert c.snapshot() == {"failures": 1, "field_failures": 0}
    [rec] = caplog.records
    assert rec.getMessage() == "boltrl_test: on_span_end failed; the record is lost"
    assert rec.exc_info is not None and rec.exc_info[0] is ValueError


def test_field_returns_the_value_or_none_and_counts(caplog: pytest.LogCaptureFixture) -> None:
    c = Counters("boltrl_test", LOG)

    def usage(x: dict[str, int]) -> int:
        return x["tokens"]

    assert c.field(usage, {"tokens": 3}) == 3
    with caplog.at_level(logging.DEBUG, logger=LOG.name):
        assert c.field(usage, {}) is None
    assert c.snapshot() == {"failures": 0, "field_failures": 1}
    [rec] = caplog.records
    assert rec.levelno == logging.DEBUG
    assert rec.getMessage() == "boltrl_test: usage failed; field left empty"


def test_new_id_has_the_records_format() -> None:
    a, b = new_id("ann"), new_id("ann")
    assert re.fullmatch(r"ann-[0-9a-f]{32}", a) and a != b


class _Dumped:
    def model_dump(self) -> dict[str, object]:
        return {"k": (1, {2: "v"})}


class _Broken:
    def model_dump(self) -> object:
        raise RuntimeError("no")

    def __str__(self) -> str:
        return "broken"


def test_jsonable_rebuilds_structure_and_dumps_objects() -> None:
    assert jsonable({"a": [_Dumped(), _Broken(), None], 3: (1.5, True)}) == {
        "a": [{"k": [1, {"2": "v"}]}, "broken", None],
        "3": [1.5, True],
    }
    assert jsonable({1, 2}) in ("{1, 2}", "{2, 1}")
    d = _Dumped()
    assert jsonable(d, ()) == str(d)  # no dump methods asked for
