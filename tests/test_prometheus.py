"""The Prometheus exporter: vLLM's metric names, values equal to the statistics, served on loopback."""

import socket
import urllib.request

import pytest
import torch
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import hf_spec
from hf_spec.prometheus import PrometheusMetrics

from .conftest import tiny_pair

PROMPT = torch.tensor([[0, 5, 9, 5, 9, 5, 3, 7, 11, 5, 9]])


def scrape(text: str) -> dict:
    """{(sample name, frozenset(labels)): value} of a /metrics page."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_served_metrics_equal_the_statistics():
    target, draft = tiny_pair()
    metrics = PrometheusMetrics()
    server, thread = metrics.serve(free_port())
    try:
        totals = {}
        for method, drafter in [("draft", hf_spec.DraftModelDrafter(draft, 3)), ("ngram", hf_spec.NgramDrafter(4))]:
            total = hf_spec.SpecStats()
            for max_new in (20, 31):  # two calls: the counters add up across calls
                out = target.generate(PROMPT, max_new_tokens=max_new, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                                      drafter=drafter, event_listeners=[metrics.listener(method)])
                total.merge(out.stats)
            totals[method] = total
        page = urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10).read().decode()
    finally:
        server.shutdown()
    got = scrape(page)
    for method, s in totals.items():
        lab = frozenset({"method": method}.items())
        assert got[("hf_spec:spec_decode_num_drafts_total", lab)] == s.num_drafts
        assert got[("hf_spec:spec_decode_num_draft_tokens_total", lab)] == s.num_draft_tokens
        assert got[("hf_spec:spec_decode_num_accepted_tokens_total", lab)] == s.num_accepted_tokens
        assert got[("hf_spec:spec_decode_num_emitted_tokens_total", lab)] == s.num_emitted_tokens
        assert got[("hf_spec:spec_decode_draft_acceptance_rate", lab)] == pytest.approx(s.acceptance_rate)
        assert got[("hf_spec:spec_decode_system_efficiency", lab)] == pytest.approx(s.system_efficiency)
        for i, n in enumerate(s.accepted_per_position):
            key = ("hf_spec:spec_decode_num_accepted_tokens_per_pos_total",
                   frozenset({"method": method, "position": str(i)}.items()))
            assert got.get(key, 0.0) == n
        assert s.num_draft_tokens > 0 and 0 < s.system_efficiency <= 1


def test_an_existing_registry_and_another_prefix():
    from prometheus_client import generate_latest

    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry=registry, prefix="vllm:")
    stats = hf_spec.SpecStats(num_drafts=2, num_draft_tokens=6, num_accepted_tokens=3, num_emitted_tokens=7,
                              num_row_steps=4, num_sequences=1, accepted_per_position=[2, 1, 0],
                              drafted_per_position=[2, 2, 2], reached_per_position=[2, 2, 1])
    metrics.observe(stats, "medusa")
    got = scrape(generate_latest(registry).decode())
    lab = frozenset({"method": "medusa"}.items())
    assert got[("vllm:spec_decode_num_accepted_tokens_total", lab)] == 3
    assert got[("vllm:spec_decode_draft_acceptance_rate", lab)] == 0.5
    assert got[("vllm:spec_decode_system_efficiency", lab)] == pytest.approx(6 / 9)  # (7-1) / (6 + 3)
    with pytest.raises(ValueError):  # the same names twice in one registry: prometheus-client refuses
        PrometheusMetrics(registry=registry, prefix="vllm:")
