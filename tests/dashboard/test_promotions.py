"""The Promotions page: ``boltrl serve``'s decision log through the API and in a real
headless Chromium."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Served, serve

from boltrl.store import open_store


def _decision(
    round_no: int, decision: str, served: int, after: int, cand: float, was: float
) -> dict[str, Any]:
    return {
        "round": round_no,
        "time": time.time() - 60 + round_no,
        "decision": decision,
        "served_version": served,
        "candidate_version": served if decision == "initial" else served + 1,
        "version_after": after,
        "served_score": was,
        "candidate_score": cand,
        "tolerance": 0.02,
        "gate_tasks": 8,
        "candidate_failed": 0,
        "gate_s": 1.5,
        "sessions": 0 if decision == "initial" else 16,
        "trained_sessions": 0 if decision == "initial" else 14,
        "transitions": 14,
        "dropped_stale": 2,
        "over_budget": 0,
        "expired": 3,
        "session_reward_mean": 0.4,
        "update_s": 2.0,
        "reason": f"{decision} reason",
    }


LOG = [
    _decision(0, "initial", 0, 0, 0.25, 0.25),
    _decision(1, "promote", 0, 1, 0.375, 0.25),
    _decision(2, "rollback", 1, 1, 0.125, 0.375),
    _decision(3, "promote", 1, 2, 0.5, 0.375),
]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Path]]:
    folder = tmp_path_factory.mktemp("promotions")
    log = folder / "promotions.jsonl"
    log.write_text("".join(json.dumps(d) + "\n" for d in LOG) + '{"torn": ')
    store = open_store(f"sqlite:///{folder}/store.db")
    try:
        with serve(store, promotions=log) as srv:
            yield srv, log
    finally:
        store.close()


def test_api_lists_decisions_and_skips_a_torn_line(site: tuple[Served, Path]) -> None:
    srv, log = site
    body = srv.get("/api/promotions")
    assert body == {
        "path": str(log),
        "available": True,
        "decisions": LOG,
        "total": 4,
        "skipped": 1,
    }


def test_api_without_a_log(tmp_path: Path) -> None:
    store = open_store("memory://")
    try:
        with serve(store) as srv:
            assert srv.get("/api/promotions") == {
                "path": None,
                "available": False,
                "decisions": [],
                "total": 0,
                "skipped": 0,
            }
    finally:
        store.close()


def test_page_shows_versions_decisions_and_figures(
    site: tuple[Served, Path], page: Any, shots: Path
) -> None:
    srv, log = site
    page.goto(f"{srv.url}/#/promotions")
    page.locator("table.promotions tbody tr").first.wait_for()
    rows = page.locator("table.promotions tbody tr")
    assert rows.count() == 4
    newest = rows.nth(0).locator("td").all_inner_texts()
    assert newest[0] == "3" and newest[2] == "promote" and newest[3] == "v1 → v2"
    assert newest[4:7] == ["0.5", "0.375", "0.02"]
    assert newest[7] == "16 / 14" and newest[8:10] == ["2", "3"]
    assert newest[11] == "promote reason"
    rollback = page.locator('tr[data-decision="rollback"] td').all_inner_texts()
    assert rollback[2:5] == ["rollback", "v1 → v1", "0.125"]
    assert page.locator(".summary").inner_text() == (
        f"{log}: serving v2 · 2 promoted · 1 rolled back"
    )
    # the served score steps 0.25 -> 0.375 -> 0.375 -> 0.5; candidates drawn beside it
    assert page.locator("polyline.curve-served").count() == 1
    assert page.locator("polyline.curve-candidate").count() == 1
    assert page.locator("a.active").inner_text() == "Promotions"
    page.screenshot(path=shots / "promotions.png", full_page=True)
