"""Execution match: run the predicted and the gold query, compare what they return.

Queries run on a read-only connection (``file:…?mode=ro``) that also refuses, through
SQLite's authorizer, anything but reading (no ATTACH, no PRAGMA, no writes to a temp
table), one statement at a time, under a wall-clock limit enforced by a progress
handler. A query that fails to parse, writes, runs past the limit or returns more than
``MAX_ROWS`` rows scores 0.

Results are compared as Spider's execution accuracy does: as multisets of rows, or as
lists when the gold query orders its result (``ORDER BY``), with floats rounded to 4
decimals. Columns must match in order.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

TIME_LIMIT_S = 2.0
"""Wall-clock budget of one query."""
MAX_ROWS = 10_000
"""More rows than this is not an answer to a question; the query scores 0."""

_ALLOWED = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    sqlite3.SQLITE_RECURSIVE,
}


class QueryError(Exception):
    """The query could not be run to completion; the message says why."""


def _authorize(action: int, *_: Any) -> int:
    return sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY


def execute(
    db_path: str | Path, sql: str, *, time_limit_s: float = TIME_LIMIT_S
) -> list[tuple[Any, ...]]:
    """The rows ``sql`` returns on the database at ``db_path``, read-only and time-limited.

    Raises ``QueryError`` for SQL that is malformed, writes, times out or returns more
    than ``MAX_ROWS`` rows.
    """
    uri = f"{Path(db_path).resolve().as_uri()}?mode=ro"
    try:
        db = sqlite3.connect(uri, uri=True, check_same_thread=False)
    except sqlite3.Error as e:
        raise QueryError(f"cannot open {db_path}: {e}") from e
    deadline = time.monotonic() + time_limit_s
    try:
        db.set_authorizer(_authorize)
        # called every 1,000 SQLite VM steps; a true value aborts the query
        db.set_progress_handler(lambda: time.monotonic() > deadline, 1000)
        cur = db.execute(sql)
        rows = cur.fetchmany(MAX_ROWS + 1)
    except sqlite3.OperationalError as e:
        if str(e) == "interrupted":
            raise QueryError(f"timed out after {time_limit_s:g} s") from e
        raise QueryError(str(e)) from e
    except (sqlite3.Error, ValueError) as e:  # Warning (two statements), DatabaseError, ...
        raise QueryError(str(e)) from e
    finally:
        db.close()
    if len(rows) > MAX_ROWS:
        raise QueryError(f"more than {MAX_ROWS} rows")
    return rows


def _norm(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(round(v, 4) if isinstance(v, float) else v for v in row)


_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)


def same_result(pred: list[tuple[Any, ...]], gold: list[tuple[Any, ...]], ordered: bool) -> bool:
    """Whether two results are the same answer (see the module docstring)."""
    p, g = [_norm(r) for r in pred], [_norm(r) for r in gold]
    return p == g if ordered else Counter(p) == Counter(g)


def execution_match(pred_sql: str | None, gold_sql: str, db_path: str | Path) -> float:
    """1.0 when ``pred_sql`` returns what ``gold_sql`` returns on the database, else 0.0.

    A missing, malformed, writing or runaway prediction scores 0.0; a gold query that
    fails raises ``QueryError`` (bad data, not a bad answer).
    """
    gold = execute(db_path, gold_sql)
    if not pred_sql or not pred_sql.strip():
        return 0.0
    try:
        pred = execute(db_path, pred_sql)
    except QueryError:
        return 0.0
    return 1.0 if same_result(pred, gold, ordered=bool(_ORDER_BY.search(gold_sql))) else 0.0
