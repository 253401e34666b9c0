"""Prometheus export of speculative decoding metrics, under vLLM's metric names so that existing dashboards
work (vLLM ``vllm/spec_decode/metrics.py`` and ``vllm/v1/spec_decode/metrics.py``; hf-spec's default prefix
is ``hf_spec:`` where vLLM's is ``vllm:``).

Counters (label ``method``; the per-position one also ``position``, 0-based as in vLLM):
``{prefix}spec_decode_num_drafts_total``, ``{prefix}spec_decode_num_draft_tokens_total``,
``{prefix}spec_decode_num_accepted_tokens_total``, ``{prefix}spec_decode_num_accepted_tokens_per_pos_total``,
``{prefix}spec_decode_num_emitted_tokens_total``; gauges ``{prefix}spec_decode_draft_acceptance_rate``
(accepted over drafted tokens) and ``{prefix}spec_decode_system_efficiency`` (emitted tokens over the most
the drafts allowed), over everything observed for that method.

Built on ``prometheus-client``::

    metrics = PrometheusMetrics()                  # its own registry; registry=prometheus_client.REGISTRY to share
    metrics.serve(9400)                            # http://127.0.0.1:9400/metrics
    out = model.generate(..., custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=d,
                         event_listeners=[metrics.listener("draft")])   # live, step by step
    metrics.observe(out.stats, "draft")            # or: once per finished call (not both for one call)
"""

from __future__ import annotations

from .events import EventListener, StepEvent
from .metrics import SpecStats

__all__ = ["PrometheusMetrics"]

_COUNTERS = {
    "num_drafts": ("spec_decode_num_drafts", "Drafts verified (row-steps that drafted at least one token)"),
    "num_draft_tokens": ("spec_decode_num_draft_tokens", "Drafted tokens verified by the target"),
    "num_accepted_tokens": ("spec_decode_num_accepted_tokens", "Drafted tokens accepted"),
    "num_emitted_tokens": ("spec_decode_num_emitted_tokens", "Tokens emitted (accepted + one per target forward and row)"),
}


class PrometheusMetrics:
    """Prometheus counters and gauges fed from hf-spec statistics.

    Args:
        registry: a ``prometheus_client.CollectorRegistry`` to register in (e.g. ``prometheus_client.REGISTRY``,
            the process-wide one); default: a new registry of its own, so several instances never collide.
        prefix: prepended to every metric name (default ``"hf_spec:"``; ``"vllm:"`` mimics vLLM exactly).

    Raises:
        ImportError: ``prometheus-client`` is not installed (``pip install prometheus-client``).
        ValueError: (from prometheus-client) the names are already registered in ``registry``.

    Attributes:
        totals: per method label, the aggregate :class:`~hf_spec.metrics.SpecStats` of everything observed.
    """

    def __init__(self, registry=None, prefix: str = "hf_spec:"):
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge
        except ImportError as e:  # pragma: no cover - a dependency of hf-spec
            raise ImportError("Prometheus export needs prometheus-client: pip install prometheus-client") from e
        self.registry = registry if registry is not None else CollectorRegistry()
        self.prefix = prefix
        self.counters = {key: Counter(prefix + name, doc, ["method"], registry=self.registry)
                         for key, (name, doc) in _COUNTERS.items()}
        self.per_position = Counter(prefix + "spec_decode_num_accepted_tokens_per_pos",
                                    "Drafted tokens accepted, by draft position (0-based)", ["method", "position"],
                                    registry=self.registry)
        self.acceptance_rate = Gauge(prefix + "spec_decode_draft_acceptance_rate",
                                     "Accepted over drafted tokens", ["method"], registry=self.registry)
        self.system_efficiency = Gauge(prefix + "spec_decode_system_efficiency",
                                       "Emitted tokens over the most the drafts allowed", ["method"],
                                       registry=self.registry)
        self.totals: dict[str, SpecStats] = {}

    def observe(self, stats: SpecStats, method: str = "hf_spec") -> None:
        """Add one finished call's statistics (``out.stats``) under the label ``method``."""
        total = self.totals.setdefault(method, SpecStats())
        for key, counter in self.counters.items():
            counter.labels(method=method).inc(getattr(stats, key))
        for i, n in enumerate(stats.accepted_per_position):
            self.per_position.labels(method=method, position=str(i)).inc(n)
        total.merge(stats)
        self.acceptance_rate.labels(method=method).set(total.acceptance_rate)
        self.system_efficiency.labels(method=method).set(total.system_efficiency)

    def listener(self, method: str = "hf_spec") -> EventListener:
        """An event listener (``event_listeners=[...]``) that updates the metrics after every target forward,
        so a scrape during a long generation sees it progress."""

        def on_event(event: StepEvent) -> None:
            one = SpecStats()
            one(event)
            self.observe(one, method)

        return on_event

    def serve(self, port: int, addr: str = "127.0.0.1"):
        """Serve ``/metrics`` over HTTP in a background thread (loopback by default; ``addr="0.0.0.0"`` to
        expose it). Returns prometheus-client's ``(server, thread)``; ``server.shutdown()`` stops it.

        Raises:
            OSError: the port is taken.
        """
        from prometheus_client import start_http_server

        return start_http_server(port, addr=addr, registry=self.registry)
