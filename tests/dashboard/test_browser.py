"""The dashboard in a real headless Chromium (Debian's, driven by Playwright), on a
SQLite store filled with real multi-agent rollouts and two synthetic runs. Screenshots
land in ``artifacts/screenshots/``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Filled, Served, fill, serve

from boltrl import Task
from boltrl.store import open_store


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Filled]]:
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('browser')}/store.db")
    filled = fill(store, "sqlite")
    try:
        with serve(store) as srv:
            yield srv, filled
    finally:
        store.close()


def test_runs_page_draws_reward_curves(site: tuple[Served, Filled], page: Any, shots: Path) -> None:
    srv, _ = site
    page.goto(f"{srv.url}/#/runs")
    run_a = page.locator('.run[data-run="run-a"]')
    run_a.locator("polyline.curve-train").wait_for()
    assert run_a.locator("svg.plot").first.locator("circle").count() == 6 + 3  # train + val
    assert run_a.locator("polyline.curve-val").count() == 1
    assert run_a.locator(".failed-count").inner_text() == "5"
    assert run_a.locator("rect.bar").count() >= 1 + 5  # throughput + failures per step
    assert page.locator("#live").inner_text() == "live"
    page.screenshot(path=shots / "runs.png", full_page=True)


def test_rollouts_table_filters_and_paginates(
    site: tuple[Served, Filled], page: Any, shots: Path
) -> None:
    srv, _ = site
    page.goto(f"{srv.url}/#/rollouts?limit=25")
    info = page.locator(".page-info")
    page.wait_for_function("document.querySelector('.page-info').textContent.includes('of 77')")
    assert info.inner_text() == "1\u201325 of 77"
    first_page = page.locator("tbody tr").all_inner_texts()
    assert len(first_page) == 25
    page.click("button.next")
    page.wait_for_function(
        "document.querySelector('.page-info').textContent.startsWith('26\u201350')"
    )
    assert page.locator("tbody tr").all_inner_texts() != first_page
    assert "offset=25" in page.url
    page.select_option("select[name=status]", "failed")
    page.wait_for_function("document.querySelector('.page-info').textContent === '1\u20137 of 7'")
    statuses = page.locator("tbody tr td:first-child").all_inner_texts()
    assert statuses == ["failed"] * 7
    page.select_option("select[name=run]", "run-b")
    page.wait_for_function("document.querySelector('.page-info').textContent === '1\u20132 of 2'")
    page.select_option("select[name=status]", "")
    page.select_option("select[name=agent]", "planner")
    page.wait_for_function("document.querySelector('.page-info').textContent === '1\u201310 of 10'")
    assert set(page.locator("tbody tr td:nth-child(8)").all_inner_texts()) == {"planner"}
    page.screenshot(path=shots / "rollouts.png", full_page=True)


def test_detail_shows_the_call_tree_with_tools_and_rewards(
    site: tuple[Served, Filled], page: Any, shots: Path
) -> None:
    srv, filled = site
    page.goto(f"{srv.url}/#/rollout/{filled.real[0]}")
    page.locator(".trace .node.call").first.wait_for()
    assert page.locator(".node.span").count() == 3
    assert page.locator(".node.call").count() == 4
    solver_call = page.locator(".node.span .node.call").nth(1)
    assert solver_call.locator(".node.tool .label").inner_text().endswith("calculator")
    assert solver_call.locator(".node.reward .label").inner_text() == "tool_ok = 0.25"
    assert page.locator(".node.span > .row .label").all_inner_texts() == [
        "planner agent turn",
        "solver agent turn",
        "critic agent turn",
    ]
    solver_call.locator(":scope > .row").click()
    body = solver_call.locator(":scope > .body")
    assert "You solve." in body.locator(".messages").inner_text()
    assert "tool call → calculator" in body.locator(".response").text_content()
    assert "credited reward1" in body.locator(".kv").text_content()
    body.locator("button.show-tokens").click()
    body.locator(".tokens .tok").first.wait_for()
    assert body.locator(".tokens").inner_text().startswith("<tool_call>")
    solver_call.locator(".node.tool > .row").click()
    tool_body = solver_call.locator(".node.tool > .body")
    assert '"expr": "2+2"' in tool_body.locator("pre.args").inner_text()
    assert '"value": 4' in tool_body.locator("pre.result").inner_text()
    page.screenshot(path=shots / "detail.png", full_page=True)


def test_model_output_renders_as_text(site: tuple[Served, Filled], page: Any) -> None:
    srv, filled = site
    page.goto(f"{srv.url}/#/rollout/{filled.real[1]}")
    answer = page.locator(".node.call").nth(2)
    answer.wait_for()
    assert "<script>window.__xss = 1</script>" in answer.locator(".label").inner_text()
    answer.locator(":scope > .row").click()
    assert "<img src=x onerror=" in answer.locator(".response pre").inner_text()
    assert page.evaluate("window.__xss") is None
    assert page.locator("main script, main img").count() == 0


def test_failed_rollout_shows_its_traceback(site: tuple[Served, Filled], page: Any) -> None:
    srv, _ = site
    page.goto(f"{srv.url}/#/rollouts?status=failed&run=run-a")
    page.locator("tbody tr a").first.click()
    page.locator("table.attempts details summary").click()
    tb = page.locator("pre.traceback").inner_text()
    assert tb.startswith("Traceback (most recent call last):") and "ValueError: <b>bad</b>" in tb


def test_workers_page(site: tuple[Served, Filled], page: Any, shots: Path) -> None:
    srv, filled = site
    page.goto(f"{srv.url}/#/workers")
    row = page.locator('tr[data-worker="w-tools"]')
    row.wait_for()
    assert row.locator(".badge").inner_text() == "busy"
    assert filled.running in row.inner_text()
    page.screenshot(path=shots / "workers.png", full_page=True)


def test_live_update_without_reload(page: Any, shots: Path) -> None:
    store = open_store("memory://")
    try:
        with serve(store) as srv:
            page.goto(f"{srv.url}/#/rollouts")
            page.wait_for_function("document.querySelector('.page-info').textContent === '0 of 0'")
            page.locator("#live.on").wait_for()
            page.evaluate("window.__sameDocument = true")
            tasks = [
                Task(id=f"live-{i}", input={}, metadata={"run": "live", "step": i})
                for i in range(2)
            ]
            store.enqueue(tasks)
            page.wait_for_function(
                "document.querySelector('.page-info').textContent === '1\u20132 of 2'"
            )
            for i in range(len(tasks)):
                att = store.claim("w-live")
                assert att is not None
                store.finish(att, "succeeded", reward=0.5 + i)
            cells = "[...document.querySelectorAll('tbody td:first-child')]"
            page.wait_for_function(f"{cells}.every(td => td.textContent === 'succeeded')")
            page.click("nav a[data-page=runs]")
            page.locator('.run[data-run="live"] polyline.curve-untagged').wait_for(state="attached")
            att_ids = store.enqueue(
                [Task(id="live-2", input={}, metadata={"run": "live", "step": 2})]
            )
            att = store.claim("w-live")
            assert att is not None and att.rollout_id == att_ids[0]
            store.finish(att, "succeeded", reward=2.0)
            plot = "document.querySelector('.run[data-run=\"live\"] svg.plot')"
            page.wait_for_function(f"{plot}.querySelectorAll('circle').length === 3")
            assert page.evaluate("window.__sameDocument") is True
            page.screenshot(path=shots / "live.png", full_page=True)
            page.goto("about:blank")  # before the server stops under the live stream
    finally:
        store.close()
