"""The ingress's hop histograms, read from its Prometheus endpoint around a run.

The summary hop runs after the answer is delivered, so `Server-Timing` cannot carry it: its time
comes from `ray_macaron_summary_hop_seconds` (sum and count) scraped before and after the run,
once every routed turn's summary has landed. Under Ray a histogram's `_sum` is made of bucket
midpoints (see `observability.metrics`), so that mean is approximate there and exact standalone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from macaron_ray.observability.metrics import ROUTE_HOP, SUMMARY_HOP, MetricSpec

REPORT_TABLE_1 = {
    "Macaron-V1-Venti": {"route_s": 0.54, "summary_s": 0.97, "share": 0.32},
    "Macaron-V1-Tall": {"route_s": 0.20, "summary_s": 0.32, "share": 0.30},
}
"""The report's per-hop averages (48 requests, temperature 0); `share` is route + summary over
the three hops' total."""


@dataclass(frozen=True)
class Totals:
    """One histogram's `_sum` and `_count`, over every label set."""

    sum: float = 0.0
    count: float = 0.0

    def __add__(self, other: "Totals") -> "Totals":
        return Totals(self.sum + other.sum, self.count + other.count)

    def __sub__(self, before: "Totals") -> "Totals":
        return Totals(self.sum - before.sum, self.count - before.count)

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None


def histogram_totals(text: str, spec: MetricSpec) -> Totals:
    total = Totals()
    for family in text_string_to_metric_families(text):
        if family.name == spec.exposed:
            for sample in family.samples:
                if sample.name == spec.exposed + "_sum":
                    total += Totals(sum=sample.value)
                elif sample.name == spec.exposed + "_count":
                    total += Totals(count=sample.value)
    return total


class HopScraper:
    """Route and summary histograms of one deployment's metrics endpoint(s), before and after."""

    def __init__(self, urls: list[str], timeout_s: float = 10.0):
        self.urls, self.timeout_s = urls, timeout_s

    def read(self) -> dict[str, Totals]:
        texts = [httpx.get(url, timeout=self.timeout_s).text for url in self.urls]
        return {name: sum((histogram_totals(t, spec) for t in texts), Totals())
                for name, spec in (("route", ROUTE_HOP), ("summary", SUMMARY_HOP))}

    def after(self, before: dict[str, Totals], settle_s: float = 60.0, poll_s: float = 1.0) -> dict[str, Totals]:
        """The deltas since `before`, once as many summaries as route hops have been recorded
        (each routed turn gets one, after its answer) or `settle_s` has passed."""
        deadline = time.monotonic() + settle_s
        while True:
            delta = {k: v - before[k] for k, v in self.read().items()}
            if delta["summary"].count >= delta["route"].count or time.monotonic() >= deadline:
                return delta
            time.sleep(poll_s)


def hop_table(route_s: float | None, answer_s: float | None, summary_s: float | None) -> dict:
    """Mean hops and the share of route + summary in the three hops' total (the report's Table 1)."""
    if None in (route_s, answer_s, summary_s):
        return {"route_s": route_s, "answer_s": answer_s, "summary_s": summary_s, "share": None}
    total = route_s + answer_s + summary_s
    return {"route_s": route_s, "answer_s": answer_s, "summary_s": summary_s,
            "share": (route_s + summary_s) / total if total else None}
