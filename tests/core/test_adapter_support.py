"""The plumbing shared by the framework adapters: counters, failed hooks, failed fields."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable

import pytest

from boltrl.adapter_support import (
    Counters,
    Installation,
    json_or_str,
    jsonable,
    new_id,
    parse_arguments,
)

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


def test_guard_counts_and_logs_a_failing_hook_and_never_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = Counters("boltrl_test", LOG, "calls")
    seen: list[int] = []

    class Hooks:
        @c.guard()
        def on_start(self, n: int) -> None:
            seen.append(n)
            if n < 0:
                raise ValueError("odd event")

        @c.guard(lambda _self, n: f"recording event {n}")
        def on_end(self, n: int) -> None:
            raise KeyError(n)

        @c.guard("on_tool")
        def tool(self) -> None:
            c.count("calls")

    h = Hooks()
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        assert h.on_start(1) is None
        assert h.on_start(-1) is None
        assert h.on_end(7) is None
        h.tool()
    assert seen == [1, -1]
    assert c.snapshot() == {"calls": 1, "failures": 2, "field_failures": 0}
    assert [r.getMessage() for r in caplog.records] == [
        "boltrl_test: on_start failed; the record is lost",
        "boltrl_test: recording event 7 failed; the record is lost",
    ]
    assert [r.exc_info[0] for r in caplog.records if r.exc_info] == [ValueError, KeyError]
    assert Hooks.on_start.__name__ == "on_start"  # wraps keeps the hook's identity


def test_guard_names_the_hook_when_the_name_function_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = Counters("boltrl_test", LOG)

    @c.guard(lambda: "takes no arguments")
    def on_span_end(span: object) -> None:
        raise RuntimeError("boom")

    with caplog.at_level(logging.WARNING, logger=LOG.name):
        on_span_end(object())
    assert [r.getMessage() for r in caplog.records] == [
        "boltrl_test: on_span_end failed; the record is lost"
    ]


def test_installation_attaches_once_and_undoes_exactly_once() -> None:
    sdk_hooks: list[object] = ["theirs"]
    attached: list[object] = []
    inst: Installation[object] = Installation()

    def attach() -> tuple[object, Callable[[], None]]:
        hook = object()
        attached.append(hook)
        sdk_hooks.append(hook)
        return hook, lambda: sdk_hooks.remove(hook)

    assert inst.installed() is None
    inst.uninstrument()  # nothing installed: nothing to undo
    results: list[object] = []
    threads = [
        threading.Thread(target=lambda: results.append(inst.instrument(attach))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    [hook] = attached
    assert results == [hook] * 8 and inst.installed() is hook
    assert sdk_hooks == ["theirs", hook]
    inst.uninstrument()
    inst.uninstrument()
    assert sdk_hooks == ["theirs"] and inst.installed() is None
    again = inst.instrument(attach)
    assert again is not hook and sdk_hooks == ["theirs", again]


def test_installation_that_fails_to_attach_installs_nothing() -> None:
    inst: Installation[object] = Installation()

    def attach() -> tuple[object, Callable[[], None]]:
        raise RuntimeError("the SDK changed shape")

    with pytest.raises(RuntimeError, match="changed shape"):
        inst.instrument(attach)
    assert inst.installed() is None
    inst.uninstrument()


def test_json_or_str_and_parse_arguments() -> None:
    assert json_or_str({"a": [1, None]}) == {"a": [1, None]}
    assert json_or_str({1, 2}) in ("{1, 2}", "{2, 1}")  # not JSON: its str
    assert parse_arguments('{"a": 1}') == {"a": 1}
    assert parse_arguments("[1, 2]") == [1, 2]
    assert parse_arguments("not json") == "not json"
    assert parse_arguments({"a": {1}}) == "{'a': {1}}"
    assert parse_arguments(None) is None
