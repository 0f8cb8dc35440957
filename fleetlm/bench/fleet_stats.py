# The served fleet's own figures over a benchmark run, per worker: prefix-cache hit rate (tokens
# found in the cache ÷ prompt tokens looked up) and how the worker came by its requests (routed
# to it, from the shared queue, stolen from a busier worker, reclaimed from a dead one), read
# from fleetlm's GET /internal/workers (an admin key) before and after the run. Another server
# has no such endpoint: the reader then reports nothing.
from __future__ import annotations

import json
import urllib.error
import urllib.request

COUNTERS = ("prefix_cache_queries", "prefix_cache_hits", "taken_routed", "taken_shared",
            "taken_stolen", "taken_reclaimed")  # fmt: skip


class FleetStats:
    def __init__(self, base_url: str, admin_key: str) -> None:
        self.url = base_url.removesuffix("/v1").rstrip("/") + "/internal/workers"
        self.admin_key = admin_key

    def read(self) -> dict[str, dict] | None:
        """Each live worker's counters, or None when the server does not say."""
        auth = {"Authorization": f"Bearer {self.admin_key}"}
        req = urllib.request.Request(self.url, headers=auth)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                workers = json.load(r)["workers"]
        except (OSError, urllib.error.URLError, ValueError, KeyError):
            return None
        return {w["id"]: {k: int(w.get(k, 0)) for k in COUNTERS} for w in workers}


def fleet_delta(before: dict[str, dict] | None, after: dict[str, dict] | None) -> dict | None:
    """Per worker and for the fleet: the run's hit rate and request counts."""
    if after is None:
        return None
    before = before or {}
    workers = {}
    for worker, now in sorted(after.items()):
        then = before.get(worker, dict.fromkeys(COUNTERS, 0))
        workers[worker] = _figures({k: now[k] - then.get(k, 0) for k in COUNTERS})
    totals = {k: sum(w[k] for w in workers.values()) for k in ("queries", "hits", *_HOW)}
    return {"workers": workers, "fleet": _figures_of_totals(totals)}


_HOW = ("routed", "shared", "stolen", "reclaimed")


def _figures(d: dict[str, int]) -> dict:
    totals = {"queries": d["prefix_cache_queries"], "hits": d["prefix_cache_hits"]}
    totals |= {how: d[f"taken_{how}"] for how in _HOW}
    return _figures_of_totals(totals)


def _figures_of_totals(t: dict[str, int]) -> dict:
    rate = t["hits"] / t["queries"] if t["queries"] else None
    return {**t, "prefix_hit_rate": rate}


def one_line(delta: dict | None) -> str:
    if not delta:
        return ""
    parts = []
    for worker, w in delta["workers"].items():
        rate = "n/a" if w["prefix_hit_rate"] is None else f"{100 * w['prefix_hit_rate']:.1f}%"
        parts.append(
            f"{worker}: hit {rate}, routed {w['routed']}, shared {w['shared']}, "
            f"stolen {w['stolen']}, reclaimed {w['reclaimed']}"
        )
    fleet = delta["fleet"]
    rate = "n/a" if fleet["prefix_hit_rate"] is None else f"{100 * fleet['prefix_hit_rate']:.1f}%"
    return f"    fleet prefix hit {rate}; " + "; ".join(parts)
