"""The Prometheus exporter: vLLM v1's metric names, labels and buckets; counter values equal to the statistics;
latency histograms observed by vLLM's rule (one inter-token latency per request and step) from the events."""

import socket
import urllib.request

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import hf_spec
from hf_spec.events import StepEvent
from hf_spec.prometheus import PrometheusMetrics

from .conftest import tiny_pair
from .test_batching import left_pad

PROMPT = torch.tensor([[0, 5, 9, 5, 9, 5, 3, 7, 11, 5, 9]])
# vLLM v1's boundaries (vllm/v1/metrics/loggers.py), which a dashboard's histogram_quantile reads
VLLM_TTFT_LE = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0, float("inf")]
VLLM_ITL_LE = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0, float("inf")]


def scrape(text: str) -> dict:
    """{(sample name, frozenset(labels)): value} of a /metrics page."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def lab(model_name: str, method: str, **extra) -> frozenset:
    return frozenset(dict(model_name=model_name, engine="0", method=method, **extra).items())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_served_metrics_equal_the_statistics_and_the_events():
    target, _ = tiny_pair()
    metrics = PrometheusMetrics(model_name="tiny-llama")
    server, _ = metrics.serve(free_port())
    try:
        runs = {}
        # the target as its own draft (every draft accepted) and n-gram lookup (some accepted, some rejected)
        for method, drafter in [("draft", hf_spec.DraftModelDrafter(target, 3)), ("ngram", hf_spec.NgramDrafter(4))]:
            listener = metrics.listener(method)  # one listener for both calls: a step-0 event starts a new call
            total, calls = hf_spec.SpecStats(), []
            for max_new in (20, 31):  # two calls: the counters add up across calls
                events = []
                out = target.generate(PROMPT, max_new_tokens=max_new, do_sample=False, custom_generate=hf_spec.generate,
                                      return_dict_in_generate=True, drafter=drafter,
                                      event_listeners=[listener, events.append])
                total.merge(out.stats)
                calls.append((out.stats, events))
            runs[method] = total, calls
        page = urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10).read().decode()
    finally:
        server.shutdown()
    got = scrape(page)
    for method, (s, calls) in runs.items():
        key = lab("tiny-llama", method)
        assert got[("vllm:spec_decode_num_drafts_total", key)] == s.num_drafts
        assert got[("vllm:spec_decode_num_draft_tokens_total", key)] == s.num_draft_tokens
        assert got[("vllm:spec_decode_num_accepted_tokens_total", key)] == s.num_accepted_tokens
        assert got[("vllm:generation_tokens_total", key)] == s.num_emitted_tokens
        assert s.num_accepted_tokens > 0 and (method == "draft" or s.num_draft_tokens > s.num_accepted_tokens)
        for i, n in enumerate(s.accepted_per_position):  # every position has a series, zeros included
            assert got[("vllm:spec_decode_num_accepted_tokens_per_pos_total", lab("tiny-llama", method, position=str(i)))] == n
        assert ("vllm:spec_decode_num_accepted_tokens_per_pos_total",
                lab("tiny-llama", method, position=str(len(s.accepted_per_position)))) not in got

        # one request per call: one TTFT (the prefill's time), one ITL per later step, one e2e per call
        assert got[("vllm:time_to_first_token_seconds_count", key)] == len(calls)
        assert got[("vllm:time_to_first_token_seconds_sum", key)] == pytest.approx(sum(c.ttft_s for c, _ in calls))
        assert got[("vllm:inter_token_latency_seconds_count", key)] == sum(c.num_target_forwards - 1 for c, _ in calls)
        assert got[("vllm:inter_token_latency_seconds_sum", key)] == pytest.approx(
            sum(e[-1].time_s - e[0].time_s for _, e in calls))
        # a step emitting several tokens is one ITL observation: fewer observations than tokens after the first
        assert got[("vllm:inter_token_latency_seconds_count", key)] < s.num_emitted_tokens - len(calls)
        for name in ("e2e_request_latency_seconds", "request_inference_time_seconds"):
            assert got[(f"vllm:{name}_count", key)] == len(calls)
            assert got[(f"vllm:{name}_sum", key)] == pytest.approx(sum(c.total_s for c, _ in calls))
        assert got[("vllm:request_prefill_time_seconds_sum", key)] == pytest.approx(sum(c.ttft_s for c, _ in calls))
        assert got[("vllm:request_decode_time_seconds_sum", key)] == pytest.approx(
            sum(c.total_s - c.ttft_s for c, _ in calls))
        assert got[("vllm:request_time_per_output_token_seconds_count", key)] == len(calls)
        assert got[("vllm:request_time_per_output_token_seconds_sum", key)] == pytest.approx(
            sum(c.tpot_s for c, _ in calls))
        # cumulative buckets at vLLM's boundaries; the +Inf bucket holds every observation
        for name, les in [("time_to_first_token_seconds", VLLM_TTFT_LE), ("inter_token_latency_seconds", VLLM_ITL_LE)]:
            buckets = sorted((float(dict(k)["le"]), v) for (n, k), v in got.items()
                             if n == f"vllm:{name}_bucket" and dict(k)["method"] == method)
            assert [le for le, _ in buckets] == les
            assert [v for _, v in buckets] == sorted(v for _, v in buckets)
            assert buckets[-1][1] == got[(f"vllm:{name}_count", key)]

    families = list(text_string_to_metric_families(page))
    ours = [f for f in families if f.name.startswith("vllm:")]
    assert ours and all(s.labels.get("model_name") == "tiny-llama" and s.labels.get("engine") == "0"
                        for f in ours for s in f.samples)
    # the lifetime gauges are gone (ratios are PromQL's), and nothing is left under the old prefix
    assert not [f.name for f in families if "acceptance_rate" in f.name or "system_efficiency" in f.name
                or f.name.startswith("hf_spec:")]


def test_batch_rows_are_requests():
    """Rows ending at different steps: one TTFT and one e2e per row, one ITL per step each row took part in."""
    target, draft = tiny_pair()
    prompts = [[0, 5, 9, 5, 9, 5, 3], [0, 7], [0, 11, 5, 9, 5, 9, 5, 3, 7, 11, 5, 9]]
    ids, mask = left_pad(prompts)
    eos = [1, target.generate(torch.tensor([prompts[1]]), max_new_tokens=3, do_sample=False)[0, -1].item()]
    metrics = PrometheusMetrics(model_name="tiny-llama")
    events = []
    out = target.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, eos_token_id=eos,
                          custom_generate=hf_spec.generate, return_dict_in_generate=True,
                          drafter=hf_spec.DraftModelDrafter(draft, 3),
                          event_listeners=[metrics.listener("draft"), events.append])
    steps_of = {b: [e for e in events if e.step > 0 and b in e.rows] for b in range(len(prompts))}
    assert len({len(steps) for steps in steps_of.values()}) > 1  # the rows really ended at different steps
    got = scrape(generate_latest(metrics.registry).decode())
    key = lab("tiny-llama", "draft")
    assert got[("vllm:time_to_first_token_seconds_count", key)] == len(prompts)
    assert got[("vllm:inter_token_latency_seconds_count", key)] == sum(len(s) for s in steps_of.values())
    end = {b: (steps[-1] if steps else events[0]).time_s for b, steps in steps_of.items()}
    assert got[("vllm:e2e_request_latency_seconds_count", key)] == len(prompts)
    assert got[("vllm:e2e_request_latency_seconds_sum", key)] == pytest.approx(sum(end.values()))
    assert got[("vllm:request_time_per_output_token_seconds_sum", key)] == pytest.approx(
        sum(out.stats.per_row[b].tpot_s for b in range(len(prompts))))
    assert got[("vllm:generation_tokens_total", key)] == out.stats.num_emitted_tokens
    # what vLLM's example Grafana dashboard reads besides: prompt tokens, finish reasons, lengths, running requests
    assert got[("vllm:prompt_tokens_total", key)] == sum(map(len, prompts)) == out.stats.num_prompt_tokens
    emitted = [out.stats.per_row[b].num_emitted_tokens for b in range(len(prompts))]
    reasons = ["length" if n == 16 else "stop" for n in emitted]
    assert set(reasons) == {"stop", "length"}  # row 1 ends at EOS, the others at max_new_tokens
    for reason in ("stop", "length", "abort"):  # every reason has a series, 0 included
        assert got[("vllm:request_success_total", lab("tiny-llama", "draft", finished_reason=reason))] == \
            reasons.count(reason)
    assert got[("vllm:request_prompt_tokens_count", key)] == len(prompts)
    assert got[("vllm:request_prompt_tokens_sum", key)] == sum(map(len, prompts))
    for name in ("request_generation_tokens", "request_max_num_generation_tokens"):
        assert got[(f"vllm:{name}_sum", key)] == sum(emitted)
    les = sorted(float(dict(k)["le"]) for (n, k), _ in got.items() if n == "vllm:request_prompt_tokens_bucket")
    assert les[:6] == [1, 2, 5, 10, 20, 50] and les[-2] <= metrics.max_model_len < 10 * les[-2]  # vLLM's 1-2-5
    assert got[("vllm:time_per_output_token_seconds_count", key)] == \
        got[("vllm:inter_token_latency_seconds_count", key)]
    assert got[("vllm:num_requests_running", key)] == 0 and got[("vllm:num_requests_waiting", key)] == 0


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_call_that_raises_closes_its_requests_as_aborted(error):
    """A call that raised mid-way left its requests open: the running gauge stayed up and no finish reason was
    counted. Now the loop sends the caller's listeners one aborted event for the rows still running (vLLM's
    finish reason "abort"); the error still propagates, and statistics kept over calls count no forward for it."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    target, draft = tiny_pair()

    class FailsAtCall(StoppingCriteria):
        def __init__(self, n):
            self.n, self.calls = n, 0

        def __call__(self, input_ids, scores, **kwargs):
            self.calls += 1
            if self.calls == self.n:
                raise error("a stopping criterion failed")
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    prompts = [[0, 5, 9, 5, 9, 5, 3], [0, 11, 5, 9]]
    ids, mask = left_pad(prompts)
    metrics = PrometheusMetrics(model_name="tiny-llama")
    kept, events = hf_spec.SpecStats(), []
    with pytest.raises(error, match="stopping criterion failed"):
        target.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, custom_generate=hf_spec.generate,
                        drafter=hf_spec.DraftModelDrafter(draft, 3), stopping_criteria=StoppingCriteriaList([FailsAtCall(9)]),
                        event_listeners=[metrics.listener("draft"), kept, events.append])
    *steps, abort = events
    assert abort.aborted and abort.rows == [0, 1] and abort.finish_reasons == ["abort", "abort"]
    assert abort.finished == [True, True] and abort.emitted == [[], []] and abort.step == steps[-1].step + 1
    assert not any(e.aborted for e in steps) and steps[-1].finish_reasons == [None, None]
    assert kept.num_target_forwards == len(steps)  # the aborted event is no forward
    got = scrape(generate_latest(metrics.registry).decode())
    key = lab("tiny-llama", "draft")
    assert got[("vllm:request_success_total", lab("tiny-llama", "draft", finished_reason="abort"))] == 2
    assert got[("vllm:request_success_total", lab("tiny-llama", "draft", finished_reason="length"))] == 0
    assert got[("vllm:num_requests_running", key)] == 0
    assert got[("vllm:e2e_request_latency_seconds_count", key)] == 0  # no finished request's latency
    assert got[("vllm:generation_tokens_total", key)] == kept.num_emitted_tokens > 0


@pytest.mark.parametrize("at_step", [0, 2])
def test_a_listener_that_raises_closes_what_each_listener_saw(at_step):
    """A second break-it finding: a listener raising on the first event left the running gauge up for good (no
    abort was sent: the rows were known only once every listener had taken an event), and one raising later had the
    listeners before it see a row finish at that step, then abort it again. Now each listener gets the rows still
    running after the last event it was handed: the metrics close every request once."""
    target, draft = tiny_pair()
    prompts = [[0, 5, 9, 5, 9, 5, 3], [0, 11, 5, 9]]
    ids, mask = left_pad(prompts)
    metrics = PrometheusMetrics(model_name="tiny-llama")
    before, after = [], []

    def raises(event):
        if event.step == at_step:
            raise RuntimeError("a listener failed")

    with pytest.raises(RuntimeError, match="a listener failed"):
        target.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, custom_generate=hf_spec.generate,
                        drafter=hf_spec.DraftModelDrafter(draft, 3),
                        event_listeners=[metrics.listener("draft"), before.append, raises, after.append])
    # the listeners before the failing one were handed step at_step, the one after it was not
    assert before[-1].aborted and before[-1].step == at_step + 1 and before[-2].step == at_step
    assert (after[-1].aborted and after[-1].step == at_step) if at_step else after == []
    for events in (before, after):
        closed = [r for e in events for r, reason in zip(e.rows, e.finish_reasons or []) if reason]
        assert sorted(closed) == sorted(set(closed))  # no row closed twice
    got = scrape(generate_latest(metrics.registry).decode())
    key = lab("tiny-llama", "draft")
    assert got[("vllm:num_requests_running", key)] == 0
    assert sum(got[("vllm:request_success_total", lab("tiny-llama", "draft", finished_reason=r))]
               for r in ("stop", "length", "abort")) == len(prompts)


def test_a_stop_string_on_the_last_allowed_token_is_a_stop(tokenizer):
    """vLLM's detokenizer says "stop" for a stop string even where the length cap was reached at the same token (its
    scheduler says "length" first for EOS there); the loop said "length" for both (a break-it finding)."""
    from transformers import StopStringCriteria, StoppingCriteriaList

    from .conftest import tiny_llama

    target = tiny_llama(vocab_size=len(tokenizer), seed=3)
    prompt = torch.tensor([tokenizer("The list: one, two,")["input_ids"]])
    plain = target.generate(prompt, max_new_tokens=12, do_sample=False)[0, prompt.shape[1]:].tolist()
    # the first new token whose text is new to the answer: a stop string that ends the answer there and not before
    j = next(j for j in range(1, 12) if (t := tokenizer.decode(plain[j:j + 1])).strip()
             and t not in tokenizer.decode(plain[:j]))
    stop = StoppingCriteriaList([StopStringCriteria(tokenizer, [tokenizer.decode(plain[j:j + 1])])])
    for max_new, reason in ((j + 1, "stop"), (j, "length")):  # the stop string at the last allowed token, or after it
        events = []
        target.generate(prompt, max_new_tokens=max_new, do_sample=False, custom_generate=hf_spec.generate,
                        drafter=hf_spec.NgramDrafter(3), stopping_criteria=stop, event_listeners=[events.append])
        assert events[-1].finish_reasons == [reason], (max_new, j)


def test_one_itl_observation_per_step_whatever_it_emits():
    """vLLM v1's rule on hand-made events: a step emitting 3 tokens is one ITL observation of the step's
    whole interval; a row that finishes leaves; ``rows`` maps listed rows to requests."""
    metrics = PrometheusMetrics(model_name="m")
    listener = metrics.listener("draft")
    ev = lambda step, drafted, acc, emitted, t, fin, rows: StepEvent(step, 3 if step else 0, drafted, acc, emitted,
                                                                     0.0, 0.0, t, fin, rows=rows)
    listener(ev(0, [[], []], [0, 0], [[4], [5]], 0.5, [False, False], [0, 1]))
    listener(ev(1, [[7, 8, 9], [6, 6, 6]], [2, 0], [[7, 8, 3], [2]], 0.75, [False, True], [0, 1]))
    listener(ev(2, [[3, 3, 3]], [0], [[9]], 1.5, [True], [0]))
    got = scrape(generate_latest(metrics.registry).decode())
    key = lab("m", "draft")
    assert got[("vllm:time_to_first_token_seconds_count", key)] == 2
    assert got[("vllm:inter_token_latency_seconds_count", key)] == 3  # row 0: 2 steps, row 1: 1 step
    assert got[("vllm:inter_token_latency_seconds_sum", key)] == pytest.approx(0.25 + 0.75 + 0.25)
    assert got[("vllm:e2e_request_latency_seconds_sum", key)] == pytest.approx(1.5 + 0.75)
    assert got[("vllm:request_decode_time_seconds_sum", key)] == pytest.approx(1.0 + 0.25)
    # row 0: 5 tokens, 1.0 s after its first; row 1: 2 tokens, 0.25 s after its first
    assert got[("vllm:request_time_per_output_token_seconds_sum", key)] == pytest.approx(1.0 / 4 + 0.25 / 1)
    assert got[("vllm:spec_decode_num_drafts_total", key)] == 3
    assert got[("vllm:spec_decode_num_accepted_tokens_per_pos_total", lab("m", "draft", position="1"))] == 1
    assert got[("vllm:spec_decode_num_accepted_tokens_per_pos_total", lab("m", "draft", position="2"))] == 0


def test_one_listener_shared_by_calls_running_in_threads():
    """A server's worker threads share one listener: two calls' events interleave (B's prefill between A's
    prefill and A's last step); every request is observed once. (Kept one call's state for all threads: B's
    prefill dropped A's request, 1 of 2 e2e observed.)"""
    import threading

    metrics = PrometheusMetrics(model_name="m")
    listener = metrics.listener("draft")
    turns = [threading.Event() for _ in range(4)]

    def call(first: int, last: int, t: float):
        turns[first].wait()
        listener(StepEvent(0, 0, [[]], [0], [[4]], 0.0, 0.0, t, [False], rows=[0]))
        turns[first + 1].set()
        turns[last].wait()
        listener(StepEvent(1, 3, [[7, 8, 9]], [2], [[7, 8, 3]], 0.0, 0.0, 2 * t, [True], rows=[0]))
        if last + 1 < len(turns):
            turns[last + 1].set()

    threads = [threading.Thread(target=call, args=(0, 2, 1.0)), threading.Thread(target=call, args=(1, 3, 10.0))]
    for th in threads:
        th.start()
    turns[0].set()
    for th in threads:
        th.join(timeout=30)
    got = scrape(generate_latest(metrics.registry).decode())
    key = lab("m", "draft")
    assert got[("vllm:time_to_first_token_seconds_count", key)] == 2
    assert got[("vllm:e2e_request_latency_seconds_count", key)] == 2
    assert got[("vllm:e2e_request_latency_seconds_sum", key)] == pytest.approx(2.0 + 20.0)
    assert got[("vllm:inter_token_latency_seconds_sum", key)] == pytest.approx(1.0 + 10.0)


def test_two_model_names_kept_apart_and_a_model_names_itself():
    target, _ = tiny_pair()
    target.name_or_path = "org/tiny-target"  # what from_pretrained sets: the hub id or folder it loaded
    metrics = PrometheusMetrics()  # no default: each listener names its model
    stats = {}
    for name, max_new in [("org/tiny-target", 12), ("other", 25)]:
        out = target.generate(PROMPT, max_new_tokens=max_new, do_sample=False, custom_generate=hf_spec.generate,
                              return_dict_in_generate=True, drafter=hf_spec.NgramDrafter(3),
                              event_listeners=[metrics.listener("ngram", model_name=target if name != "other" else name)])
        stats[name] = out.stats
    assert stats["org/tiny-target"].num_emitted_tokens != stats["other"].num_emitted_tokens
    got = scrape(generate_latest(metrics.registry).decode())
    for name, s in stats.items():
        assert got[("vllm:generation_tokens_total", lab(name, "ngram"))] == s.num_emitted_tokens
        assert got[("vllm:spec_decode_num_draft_tokens_total", lab(name, "ngram"))] == s.num_draft_tokens
        assert got[("vllm:inter_token_latency_seconds_count", lab(name, "ngram"))] == s.num_target_forwards - 1


def test_observe_counts_a_finished_call_and_another_prefix():
    registry = CollectorRegistry()
    metrics = PrometheusMetrics("m", engine=2, registry=registry, prefix="hf_spec:")
    stats = hf_spec.SpecStats(num_drafts=2, num_draft_tokens=6, num_accepted_tokens=3, num_emitted_tokens=7,
                              num_row_steps=4, num_sequences=1, accepted_per_position=[2, 1, 0],
                              drafted_per_position=[2, 2, 2], reached_per_position=[2, 2, 1])
    metrics.observe(stats, "medusa")
    metrics.observe(stats, "medusa")
    got = scrape(generate_latest(registry).decode())
    key = frozenset({"model_name": "m", "engine": "2", "method": "medusa"}.items())
    assert got[("hf_spec:spec_decode_num_accepted_tokens_total", key)] == 2 * stats.num_accepted_tokens
    assert got[("hf_spec:generation_tokens_total", key)] == 2 * stats.num_emitted_tokens
    assert got[("hf_spec:spec_decode_num_accepted_tokens_per_pos_total", key | {("position", "2")})] == 0
    # the statistics keep no step times: observe() leaves the latency histograms alone
    assert not [name for name, _ in got if "seconds" in name]
    assert not [name for name, _ in got if name.startswith("vllm:")]


def test_bad_arguments_fail_early_and_say_what_to_do():
    with pytest.raises(ValueError, match="prefix"):
        PrometheusMetrics("m", prefix="my prefix")
    with pytest.raises(ValueError, match="engine"):
        PrometheusMetrics("m", engine=-1)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="max_model_len must be an int >= 1"):
            PrometheusMetrics("m", max_model_len=bad)
    with pytest.raises(ValueError, match="model_name is empty"):
        PrometheusMetrics("")
    with pytest.raises(TypeError, match="string or a transformers model"):
        PrometheusMetrics(CollectorRegistry())  # the registry is keyword-only now
    target, _ = tiny_pair()  # built from a config: no name_or_path to stand for it
    with pytest.raises(ValueError, match="model_name='...'"):
        PrometheusMetrics(target)
    metrics = PrometheusMetrics()
    with pytest.raises(ValueError, match=r"PrometheusMetrics\(model_name=...\)"):
        metrics.listener("draft")
    with pytest.raises(ValueError, match="method"):
        metrics.listener("", model_name="m")
    with pytest.raises(TypeError, match="SpecStats"):
        metrics.observe({"num_drafts": 1}, "draft", model_name="m")
    with pytest.raises(ValueError, match="port"):
        metrics.serve(70000)
    registry = CollectorRegistry()
    PrometheusMetrics("m", registry=registry)
    with pytest.raises(ValueError, match="already in this registry"):
        PrometheusMetrics("m", registry=registry)
    # a name taken by someone else (vLLM, say): the failed instance leaves none of its own metrics behind
    from prometheus_client import Histogram

    registry = CollectorRegistry()
    taken = Histogram("vllm:request_decode_time_seconds", "taken", registry=registry)
    with pytest.raises(ValueError, match="already in this registry"):
        PrometheusMetrics("m", registry=registry)
    registry.unregister(taken)
    PrometheusMetrics("m", registry=registry)
