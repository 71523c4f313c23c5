"""The boltrl dashboard: runs, rollouts, traces and workers, live in a browser.

``boltrl dashboard --store URL`` serves it; ``create_dashboard_app(store)`` gives the
ASGI app to mount next to a store server. See ``app`` for the routes.
"""

from __future__ import annotations

from boltrl.dashboard.app import create_dashboard_app
from boltrl.dashboard.model import Filters, HeadInfo, Source
from boltrl.dashboard.source import StoreSource, open_source, source_for
from boltrl.dashboard.stats import Tracker
from boltrl.dashboard.tree import Node, build_tree

__all__ = [
    "Filters",
    "HeadInfo",
    "Node",
    "Source",
    "StoreSource",
    "Tracker",
    "build_tree",
    "create_dashboard_app",
    "open_source",
    "source_for",
]
