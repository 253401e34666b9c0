"""Prometheus export under vLLM v1's metric names, labels and histogram buckets, so that a dashboard built
for vLLM (queries such as ``vllm:e2e_request_latency_seconds_bucket{model_name="$model_name"}``) works
unchanged when pointed at hf-spec.

Source followed: vLLM v1, ``vllm/v1/spec_decode/metrics.py`` (``SpecDecodingProm``: the spec-decode counters
and their labels), ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``: the ``model_name``/``engine``
labels, the token counter, the latency histograms and their buckets) and ``vllm/v1/metrics/stats.py``
(``IterationStats``: when each histogram is observed), read at vllm-project/vllm commits ``ee4ceaae``
(spec_decode/metrics.py), ``28ed1fb8`` (stats.py) and ``005a810b`` (loggers.py), and for
``inter_token_latency_seconds`` and ``request_time_per_output_token_seconds`` a later loggers.py (vLLM 0.12
era), where both have the buckets of ``time_per_output_token_seconds``, which the first replaced (vLLM PR
#24110, "Deprecate TPOT in favor of ITL").

Every series has the labels ``model_name`` (vLLM's served model name), ``engine`` (vLLM's engine index,
``"0"``) and ``method`` (hf-spec's drafter, e.g. ``"draft"``, ``"ngram"``; an extra label, which queries that
select by ``model_name`` and aggregate with ``sum by (le)`` ignore).

Counters (prometheus-client appends ``_total`` in the exposition, as for vLLM):

- ``vllm:spec_decode_num_drafts``: drafts verified, one per request and step that drafted at least one token;
- ``vllm:spec_decode_num_draft_tokens``: drafted tokens the target verified;
- ``vllm:spec_decode_num_accepted_tokens``: drafted tokens accepted;
- ``vllm:spec_decode_num_accepted_tokens_per_pos`` (label ``position``, 0-based): drafts whose token at that
  position was accepted; every position up to the largest k asked for so far has a series (0 where nothing was
  accepted), as vLLM has one for each position up to its k;
- ``vllm:generation_tokens``: generated tokens (accepted drafted tokens plus the target's own token of each
  forward; :attr:`SpecStats.num_emitted_tokens <hf_spec.metrics.SpecStats>`);
- ``vllm:prompt_tokens``: prompt tokens of the requests (without left padding; ``SpecStats.num_prompt_tokens``);
- ``vllm:request_success`` (label ``finished_reason``: ``stop``, ``length``, ``abort``; :meth:`listener` only):
  finished requests by vLLM's finish reason (``StepEvent.finish_reasons``: ``length`` at ``max_new_tokens``,
  ``stop`` at EOS, a stop string or another stopping criterion, ``abort`` for the rows a call that raised left
  unfinished). Every reason has a series from the start, as in vLLM.

Gauges (:meth:`listener` only): ``vllm:num_requests_running``, the requests (batch rows) of the calls in
progress; ``vllm:num_requests_waiting``, always 0 (no queue: a call runs all its rows at once).

Histograms (seconds; a batch row is one request; times are measured from the start of hf-spec's decoding
loop, where vLLM measures from the request's arrival at its server; hf-spec has no queue, so vLLM's
``request_queue_time_seconds`` is not exported):

- ``vllm:time_to_first_token_seconds``: per request, the time of the prefill step (step 0), which emits the
  first token;
- ``vllm:inter_token_latency_seconds``: per request, one observation per step after the prefill: the time since
  the request's previous step. As in vLLM v1, a step that emits several tokens (an accepted draft plus the
  target's token) is observed once, with the whole interval, not once per token; so with speculation this is
  the time between a request's outputs, and the time per token is the next histogram;
- ``vllm:request_time_per_output_token_seconds``: per finished request, decode time over generated tokens
  after the first (0 for a one-token request, as in vLLM), i.e. :attr:`SpecStats.tpot_s`;
- ``vllm:e2e_request_latency_seconds``, ``vllm:request_inference_time_seconds``: per finished request, the time
  of its last step;
- ``vllm:request_prefill_time_seconds``: per finished request, the time of the prefill step;
- ``vllm:request_decode_time_seconds``: per finished request, from its first token to its last;
- ``vllm:time_per_output_token_seconds``: the observations of ``inter_token_latency_seconds`` under the name
  vLLM used for them before PR #24110 and which its example Grafana dashboard
  (``examples/online_serving/prometheus_grafana/grafana.json``) still reads.

Histograms of token counts per finished request, in vLLM's 1-2-5 buckets up to ``max_model_len``:
``vllm:request_prompt_tokens``, ``vllm:request_generation_tokens`` and ``vllm:request_max_num_generation_tokens``
(the longest sequence of the request's group; hf-spec's requests have one sequence, so it equals the previous).
A request that a failed call left unfinished (``abort``) is counted in ``request_success`` and its tokens in the
counters, but observed in no latency or length histogram.

Not exported (nothing in hf-spec measures them): ``request_queue_time_seconds``, KV-cache and prefix-cache usage
(``kv_cache_usage_perc``, ``gpu_cache_usage_perc``: hf-spec has no block pool), preemptions, ``iteration_tokens_total``
and the ``request_params_*`` histograms.

Ratios are left to PromQL, as vLLM does (``docs/user-guide.md`` lists the queries): the acceptance rate is
``rate(vllm:spec_decode_num_accepted_tokens_total[5m]) / rate(vllm:spec_decode_num_draft_tokens_total[5m])``.

Built on ``prometheus-client``::

    metrics = PrometheusMetrics(model_name="Qwen/Qwen2.5-Coder-1.5B-Instruct")  # or model_name=target
    metrics.serve(9400)                            # http://127.0.0.1:9400/metrics
    out = model.generate(..., custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=d,
                         event_listeners=[metrics.listener("draft")])   # live, step by step: all metrics
    metrics.observe(out.stats, "draft")            # or: once per finished call, the counters only
"""

from __future__ import annotations

import re
import threading

from .events import EventListener, StepEvent
from .metrics import SpecStats

__all__ = ["PrometheusMetrics"]

#: the labels of every series, in vLLM's order (``model_name``, ``engine``), then hf-spec's ``method``
LABELS = ("model_name", "engine", "method")

#: (attribute of :class:`~hf_spec.metrics.SpecStats`, metric name after the prefix, help text)
_COUNTERS = (
    ("num_drafts", "spec_decode_num_drafts",
     "Number of spec decoding drafts: requests and steps that drafted at least one token."),
    ("num_draft_tokens", "spec_decode_num_draft_tokens", "Number of draft tokens verified by the target."),
    ("num_accepted_tokens", "spec_decode_num_accepted_tokens", "Number of accepted draft tokens."),
    ("num_emitted_tokens", "generation_tokens",
     "Number of generation tokens: accepted draft tokens plus one token of the target per forward and request."),
    ("num_prompt_tokens", "prompt_tokens", "Number of prefill tokens processed."),
)

#: vLLM's finish reasons (``vllm.v1.engine.FinishReason``), the values of ``request_success``'s ``finished_reason``
FINISH_REASONS = ("stop", "length", "abort")

#: the ``max_model_len`` the token-count histograms' buckets reach to where none is given and the model does not
#: say (vLLM builds them from its server's ``max_model_len``)
DEFAULT_MAX_MODEL_LEN = 131072

#: vLLM v1's bucket boundaries, in seconds
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                         20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)

#: key -> (metric name after the prefix, help text, buckets)
_HISTOGRAMS = {
    "ttft": ("time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS),
    "itl": ("inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds: one observation per request and step after the prefill.",
            TOKEN_LATENCY_BUCKETS),
    "tpot": ("request_time_per_output_token_seconds",
             "Histogram of time per output token (after the first) per request, in seconds.", TOKEN_LATENCY_BUCKETS),
    "tpot_iteration": ("time_per_output_token_seconds",
                       "Histogram of time per output token in seconds (vLLM's earlier name of inter_token_latency: "
                       "the same observations).", TOKEN_LATENCY_BUCKETS),
    "e2e": ("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS),
    "inference": ("request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
                  REQUEST_LATENCY_BUCKETS),
    "prefill": ("request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
                REQUEST_LATENCY_BUCKETS),
    "decode": ("request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
               REQUEST_LATENCY_BUCKETS),
}

#: key -> (metric name after the prefix, help text): histograms of token counts per finished request, in vLLM's
#: 1-2-5 buckets up to ``max_model_len`` (:func:`build_1_2_5_buckets`)
_TOKEN_HISTOGRAMS = {
    "prompt_tokens": ("request_prompt_tokens", "Number of prefill tokens processed."),
    "generation_tokens": ("request_generation_tokens", "Number of generation tokens processed."),
    "max_generation_tokens": ("request_max_num_generation_tokens",
                              "Histogram of maximum number of requested generation tokens."),
}

_PREFIX = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's buckets for token counts: 1, 2, 5, 10, 20, 50, ... up to ``max_value`` (``vllm/v1/metrics/loggers.py``,
    ``build_1_2_5_buckets``)."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


def _served_name(model_name) -> str:
    """The ``model_name`` label of a string, or of a transformers model (its ``name_or_path``)."""
    if isinstance(model_name, str):
        if not model_name:
            raise ValueError("model_name is empty: give the name dashboards should filter by, e.g. the model's hub id")
        return model_name
    name = getattr(model_name, "name_or_path", None)
    if not isinstance(name, str):
        raise TypeError(f"model_name must be a string or a transformers model (its name_or_path is used), "
                        f"not {type(model_name).__name__}")
    if not name:
        raise ValueError(f"this {type(model_name).__name__} has no name_or_path (it was not loaded with "
                         f"from_pretrained): give model_name='...' as a string")
    return name


class PrometheusMetrics:
    """vLLM v1's speculative-decoding counters and request-latency histograms, fed from hf-spec's events
    (:meth:`listener`) or statistics (:meth:`observe`); the user guide's Prometheus section and the module
    ``hf_spec.prometheus`` list every metric, what it observes and the vLLM source it follows.

    The default prefix is vLLM's own, ``"vllm:"``: the prefix is part of each metric's name, and dashboards
    and alerts written for vLLM name its metrics literally (``vllm:time_to_first_token_seconds_bucket``), so
    with any other prefix every query would have to be rewritten. Prometheus tells hf-spec's series from a
    vLLM server's by the ``job`` and ``instance`` labels it adds when it scrapes; choose another prefix (e.g.
    ``"hf_spec:"``) only to keep them apart by name, or to share a registry with vLLM itself in one process.

    Args:
        model_name: the ``model_name`` label (vLLM's ``--served-model-name``, which defaults to the model's
            hub id or path), used by :meth:`listener` and :meth:`observe` unless they are given one: a string,
            or a transformers model, which stands for its ``name_or_path`` (the hub id or folder it was loaded
            from). ``None``: each :meth:`listener` / :meth:`observe` call must name one.
        engine: the ``engine`` label (vLLM's engine index): ``"0"``, or another int >= 0 / non-empty string
            to tell several hf-spec processes of one model apart.
        registry: a ``prometheus_client.CollectorRegistry`` to register in (e.g. ``prometheus_client.REGISTRY``,
            the process-wide one); default: a new registry of its own, so several instances never collide.
        prefix: prepended to every metric name (default ``"vllm:"``, see above); a Prometheus metric-name
            prefix (letters, digits, ``_`` and ``:``, not starting with a digit), or ``""``.
        max_model_len: the longest sequence in tokens (vLLM's ``--max-model-len``): the token-count histograms'
            buckets go 1, 2, 5, 10, ... up to it. Default: the context of the model given as ``model_name``
            (:func:`hf_spec.prompts.model_context`), else :data:`DEFAULT_MAX_MODEL_LEN`.

    Raises:
        ImportError: ``prometheus-client`` is not installed (``pip install prometheus-client``).
        TypeError: ``model_name`` is neither a string nor a model with a ``name_or_path``.
        ValueError: an empty ``model_name``, a bad ``engine``, ``prefix`` or ``max_model_len``, or metrics of these
            names already in ``registry`` (another ``PrometheusMetrics``, or vLLM, in this process).

    Attributes:
        registry: the ``CollectorRegistry`` holding the metrics (``prometheus_client.generate_latest(registry)``
            renders it).
    """

    def __init__(self, model_name=None, engine: int | str = "0", *, registry=None, prefix: str = "vllm:",
                 max_model_len: int | None = None):
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        except ImportError as e:  # pragma: no cover - a dependency of hf-spec
            raise ImportError("Prometheus export needs prometheus-client: pip install prometheus-client") from e
        if not isinstance(prefix, str) or (prefix and not _PREFIX.fullmatch(prefix)):
            raise ValueError(f"prefix {prefix!r} is no Prometheus metric-name prefix: use letters, digits, '_' and "
                             f"':', not starting with a digit (vLLM's is 'vllm:')")
        if isinstance(engine, bool) or not (isinstance(engine, int) and engine >= 0
                                            or isinstance(engine, str) and engine):
            raise ValueError(f"engine must be an int >= 0 or a non-empty string (vLLM's engine index, '0'), "
                             f"not {engine!r}")
        if max_model_len is not None and (isinstance(max_model_len, bool) or not isinstance(max_model_len, int)
                                          or max_model_len < 1):
            raise ValueError(f"max_model_len must be an int >= 1 (the longest sequence, in tokens: vLLM's "
                             f"--max-model-len), not {max_model_len!r}")
        if max_model_len is None and model_name is not None and not isinstance(model_name, str):
            from .prompts import model_context

            max_model_len = model_context(model_name)
        self.max_model_len = max_model_len or DEFAULT_MAX_MODEL_LEN
        self.model_name = None if model_name is None else _served_name(model_name)
        self.engine = str(engine)
        self.prefix = prefix
        self.registry = registry if registry is not None else CollectorRegistry()
        created = []
        try:
            self.counters = {}
            for attr, name, doc in _COUNTERS:
                self.counters[attr] = Counter(prefix + name, doc, LABELS, registry=self.registry)
                created.append(self.counters[attr])
            self.per_position = Counter(prefix + "spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted tokens per draft position (0-based).", LABELS + ("position",),
                                        registry=self.registry)
            created.append(self.per_position)
            self.histograms = {}
            for key, (name, doc, buckets) in _HISTOGRAMS.items():
                self.histograms[key] = Histogram(prefix + name, doc, LABELS, buckets=buckets, registry=self.registry)
                created.append(self.histograms[key])
            token_buckets = build_1_2_5_buckets(self.max_model_len)
            for key, (name, doc) in _TOKEN_HISTOGRAMS.items():
                self.histograms[key] = Histogram(prefix + name, doc, LABELS, buckets=token_buckets,
                                                 registry=self.registry)
                created.append(self.histograms[key])
            self.request_success = Counter(prefix + "request_success", "Count of successfully processed requests.",
                                           LABELS + ("finished_reason",), registry=self.registry)
            created.append(self.request_success)
            self.running = Gauge(prefix + "num_requests_running", "Number of requests in model execution batches.",
                                 LABELS, registry=self.registry)
            created.append(self.running)
            self.waiting = Gauge(prefix + "num_requests_waiting", "Number of requests waiting to be processed.",
                                 LABELS, registry=self.registry)
            created.append(self.waiting)
        except ValueError as e:  # prometheus-client: "Duplicated timeseries in CollectorRegistry"
            for metric in created:
                self.registry.unregister(metric)
            raise ValueError(f"{e}: metrics named {prefix}... are already in this registry (another "
                             f"PrometheusMetrics, or vLLM, in this process); share that PrometheusMetrics, give "
                             f"each its own registry (the default) or another prefix") from e

    def _labels(self, method: str, model_name) -> tuple[str, str, str]:
        if not isinstance(method, str) or not method:
            raise ValueError(f"method must be a non-empty string (the drafter, e.g. 'draft' or 'ngram'), not {method!r}")
        if model_name is None:
            if self.model_name is None:
                raise ValueError("no model_name: dashboards filter vLLM's metrics by model_name; give "
                                 "PrometheusMetrics(model_name=...) or model_name=... here (a string, or the "
                                 "target model for its name_or_path)")
            return self.model_name, self.engine, method
        return _served_name(model_name), self.engine, method

    def _count(self, stats: SpecStats, labels: tuple[str, str, str]) -> None:
        for attr, counter in self.counters.items():
            counter.labels(*labels).inc(getattr(stats, attr))
        # a series for every position up to the k asked for, 0 where nothing was accepted (vLLM creates one per
        # position up to its k, so that per-position acceptance reads 0 there rather than no data)
        for i, n in enumerate(stats.accepted_per_position):
            self.per_position.labels(*labels, str(i)).inc(n)

    def observe(self, stats: SpecStats, method: str = "hf_spec", model_name=None) -> None:
        """Add one finished call's statistics (``out.stats``) to the counters. The latency histograms need
        the step events, which ``SpecStats`` does not keep: for them use :meth:`listener` (and not both for
        one call, or its counters count twice).

        Args:
            stats: the call's :class:`~hf_spec.metrics.SpecStats`.
            method: the ``method`` label (the drafter).
            model_name: the ``model_name`` label (a string or a model); default: the one given at construction.

        Raises:
            TypeError: ``stats`` is not a ``SpecStats``, or ``model_name`` neither a string nor a model.
            ValueError: an empty ``method``, or no ``model_name`` here nor at construction.
        """
        labels = self._labels(method, model_name)
        if not isinstance(stats, SpecStats):
            raise TypeError(f"observe takes a call's SpecStats (out.stats), not {type(stats).__name__}")
        self._count(stats, labels)

    def listener(self, method: str = "hf_spec", model_name=None) -> EventListener:
        """An event listener (``event_listeners=[...]``) that updates every metric after each target forward,
        so a scrape during a long generation sees it progress.

        Each batch row is a request. The listener follows each thread's generate call (a step-0 event starts a
        new one in its thread), so calls in sequence and calls running concurrently in threads (a server's
        workers) may share it.

        Args:
            method: the ``method`` label (the drafter).
            model_name: the ``model_name`` label (a string, or the target model for its ``name_or_path``);
                default: the one given at construction.

        Returns:
            A callable taking one :class:`~hf_spec.events.StepEvent`.

        Raises:
            TypeError: ``model_name`` is neither a string nor a model with a ``name_or_path``.
            ValueError: an empty ``method``, or no ``model_name`` here nor at construction.
        """
        labels = self._labels(method, model_name)
        hist = {key: h.labels(*labels) for key, h in self.histograms.items()}
        success = {reason: self.request_success.labels(*labels, reason) for reason in FINISH_REASONS}
        running = self.running.labels(*labels)
        self.waiting.labels(*labels).set(0)  # no queue: a call runs its rows at once
        # per thread (a call's events come on its thread): batch row -> [first token time, last token time, tokens];
        # thread-local, so a call that failed mid-way leaves nothing once its thread ends (a dict by thread id kept
        # such calls' rows), and a thread's next call starts afresh
        calls = threading.local()

        def on_event(event: StepEvent) -> None:
            one = SpecStats()
            one(event)
            self._count(one, labels)
            if event.step == 0:  # a new call in this thread
                for _ in getattr(calls, "requests", {}):  # one left running (events built by hand): closed
                    running.dec()
                    success["abort"].inc()
                calls.requests = {}
            requests = getattr(calls, "requests", {})
            rows = event.rows if event.rows is not None else range(len(event.emitted))
            reasons = event.finish_reasons or [None] * len(event.emitted)
            prompts = event.prompt_tokens or [0] * len(event.emitted)
            for row, emitted, finished, reason, prompt in zip(rows, event.emitted, event.finished, reasons, prompts):
                if event.step == 0:
                    if not emitted:
                        continue
                    hist["ttft"].observe(event.time_s)
                    requests[row] = [event.time_s, event.time_s, len(emitted), prompt]
                    running.inc()
                else:
                    request = requests.get(row)
                    if request is None:  # its prefill was not seen by this listener
                        continue
                    if emitted:
                        hist["itl"].observe(event.time_s - request[1])
                        hist["tpot_iteration"].observe(event.time_s - request[1])
                        request[1] = event.time_s
                        request[2] += len(emitted)
                if finished and row in requests:
                    first, last, n, prompt = requests.pop(row)
                    running.dec()
                    if reason in success:  # hand-built events may give none
                        success[reason].inc()
                    if event.aborted:  # no finished request's latencies or lengths (its tokens are counted)
                        continue
                    hist["e2e"].observe(last)
                    hist["inference"].observe(last)
                    hist["prefill"].observe(first)
                    hist["decode"].observe(last - first)
                    hist["tpot"].observe((last - first) / (n - 1) if n > 1 else 0.0)
                    hist["prompt_tokens"].observe(prompt)
                    hist["generation_tokens"].observe(n)
                    hist["max_generation_tokens"].observe(n)  # one sequence per request (vLLM's n = 1)
            if not requests:  # the call is over
                calls.requests = {}

        return on_event

    def serve(self, port: int, addr: str = "127.0.0.1"):
        """Serve ``/metrics`` over HTTP in a background thread (loopback by default; ``addr="0.0.0.0"`` to
        expose it). Returns prometheus-client's ``(server, thread)``; ``server.server_port`` is the port
        (``port=0``: any free one); ``server.shutdown()`` stops it.

        Raises:
            ValueError: ``port`` is not in 0-65535.
            OSError: the port is taken.
        """
        from prometheus_client import start_http_server

        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"port must be a TCP port number 0-65535 (0: any free one), not {port!r}")
        return start_http_server(port, addr=addr, registry=self.registry)
