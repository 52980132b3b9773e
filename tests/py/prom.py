"""lemonade's /metrics read by prometheus_client's two parsers (OpenMetrics and the classic
text format), which must agree: {(sample name, sorted labels): value}. Shared by the metrics
scripts; `fail` is called with what was wrong."""

import httpx
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families as text_families


# What Prometheus sends: OpenMetrics first, the classic text format as a fallback.
ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"


def scrape(base, fail):
    r = httpx.get(f"{base}/metrics", headers={"accept": ACCEPT}, timeout=10)
    if r.status_code != 200:
        fail(r.text)
    if not r.headers["content-type"].startswith("application/openmetrics-text"):
        fail(r.headers)
    samples = {}
    for fam in openmetrics_families(r.text):
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    classic = {}
    for fam in text_families(r.text):
        for s in fam.samples:
            classic[(s.name, tuple(sorted(s.labels.items())))] = s.value
    for k, v in samples.items():
        if classic.get(k) != v:
            fail(f"the text parser read {k} as {classic.get(k)}, OpenMetrics as {v}")
    return samples


def check_plain(base, fail):
    """A client that asks for nothing in particular (curl, Lemonade v11's tests) gets the
    classic format's content type, and a body its parser reads."""
    r = httpx.get(f"{base}/metrics", timeout=10)
    if not r.headers["content-type"].startswith("text/plain; version=0.0.4"):
        fail(r.headers)
    if not any(f.name == "lemonade_server_up" for f in text_families(r.text)):
        fail("no lemonade_server_up in the classic format")
