"""Medusa heads saved by hf-spec load in vLLM: the folder is checked against vLLM's Medusa loader as read in
vLLM's source (vLLM is not installed here; it needs a GPU), and a re-implementation of vLLM's Medusa
forward, written from that source, gives hf-spec's logits from the saved file.

Read at vllm-project/vllm (commits of the stored copies):

- ``vllm/model_executor/models/medusa.py`` (09cddad8f0324594022359cd2b07e962a14b895f; the same
  ``ResidualBlock``, ``__init__`` and ``load_weights`` at 01dbb08195ca9c70ac9044786a906a353e07fcdf):
  head i is ``blocks.{i}`` = ``ResidualBlock`` with ``layers.{j}`` = ``nn.Linear(H, H,
  bias=getattr(config, "medusa_fc_bias", False))``, applied as ``x = x + SiLU(layer(x))`` for each j; then
  ``ParallelLMHead`` (no bias) ``lm_heads.{i}``, or with ``original_lm_head`` one ``lm_head`` for every
  head, and ``LogitsProcessor`` with ``logit_scale`` (default 1). ``load_weights`` strips
  ``medusa_heads.``, keeps ``token_map`` only when ``truncated_vocab_size < vocab_size``, loads names that
  are parameters, maps ``lm_heads.0.weight`` to ``lm_head.weight`` under ``original_lm_head``, and skips
  every other name silently.
- ``vllm/transformers_utils/configs/medusa.py`` (0531c2226a6a25cd96ccc856f3bda3f0bb4efb5f):
  ``MedusaConfig(hidden_size=4096, vocab_size=32001, num_heads=5, num_hidden_layers=1, max_paths=64,
  topk=10, truncated_vocab_size=None -> vocab_size)``, ``architectures`` default ``["MedusaModel"]``;
  ``from_pretrained`` renames every key containing "num" and "heads" to ``num_heads`` and "num" and
  "layers" to ``num_hidden_layers``; the ``num_lookahead_tokens`` setter sets ``num_heads``.
- ``vllm/config/speculative.py`` (002e77c1f0ef9b19cff8b9e21cfbd6feb3d6b443): ``model_type == "medusa"``
  selects the method; with the method named, ``model_type`` is injected and ``vocab_size`` aligned with
  the target's; ``num_speculative_tokens`` is written to ``num_lookahead_tokens``, i.e. vLLM builds that
  many heads.
- ``vllm/model_executor/model_loader/default_loader.py`` (00b5ad0712629374e6352e2b31de0460be0fdf17):
  a local folder's weights are every ``*.safetensors`` in it; a parameter left unloaded is an error
  ("Following weights were not initialized from checkpoint").
- ``vllm/v1/spec_decode/medusa.py`` (055e47c28003156421365af985d676fc921cb075): the proposer runs the
  draft model alone (the target's ``lm_head`` is not passed to it) and drafts each head's argmax.
"""

import json
import logging

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from hf_spec.medusa import MedusaCheckpointError, MedusaConfig, MedusaHeads

from .conftest import tiny_llama

H, V = 32, 48  # different, so that a transposed weight cannot pass


def random_heads(n=3, layers=1, variant="shared-lm-head", seed=0, scale=0.3):
    torch.manual_seed(seed)
    heads = MedusaHeads(MedusaConfig(n, layers, H, V, variant))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, scale)  # biases too: a loader that dropped them would give other logits
    return heads.eval()


# ---- vLLM, as read (see the module docstring) -----------------------------------------------------
def vllm_config(raw: dict) -> dict:
    """``MedusaConfig.from_pretrained``: the key renaming, then the constructor's defaults."""
    raw = dict(raw)
    for key in list(raw):
        if "num" in key:
            if "heads" in key:
                raw["num_heads"] = raw.pop(key)
            elif "layers" in key:
                raw["num_hidden_layers"] = raw.pop(key)
    cfg = {"hidden_size": 4096, "vocab_size": 32001, "num_heads": 5, "num_hidden_layers": 1, "max_paths": 64,
           "topk": 10, "architectures": ["MedusaModel"], **raw}
    if cfg.get("truncated_vocab_size") is None:
        cfg["truncated_vocab_size"] = cfg["vocab_size"]
    return cfg


def vllm_parameters(cfg: dict) -> dict[str, tuple[int, ...]]:
    """``dict(Medusa.named_parameters())`` as name -> the shape of the tensor its weight loader takes (a
    ``ParallelLMHead`` pads its rows to a multiple of 64 and loads the unpadded ``[truncated_vocab_size, H]``)."""
    hidden, rows = cfg["hidden_size"], cfg["truncated_vocab_size"]
    params = {}
    for i in range(cfg["num_heads"]):
        for j in range(cfg["num_hidden_layers"]):
            params[f"blocks.{i}.layers.{j}.weight"] = (hidden, hidden)
            if cfg.get("medusa_fc_bias", False):
                params[f"blocks.{i}.layers.{j}.bias"] = (hidden,)
    if cfg.get("original_lm_head", False):
        params["lm_head.weight"] = (rows, hidden)
    else:
        params.update({f"lm_heads.{i}.weight": (rows, hidden) for i in range(cfg["num_heads"])})
    return params


def vllm_load_weights(cfg: dict, weights: dict[str, torch.Tensor]):
    """``Medusa.load_weights``: returns (parameter name -> tensor, names it skipped, parameters left unloaded); a
    token map it keeps (only with ``truncated_vocab_size < vocab_size``) is under ``"token_map"``, and projections
    with more rows than the map are cut to the map's rows, as vLLM does after reading every name."""
    params = vllm_parameters(cfg)
    loaded, skipped, token_map = {}, [], None
    for name, tensor in weights.items():
        name = name.replace("medusa_heads.", "")
        if name == "token_map":
            if cfg["truncated_vocab_size"] < cfg["vocab_size"]:
                token_map = tensor
        elif name in params:
            loaded[name] = tensor
        elif cfg.get("original_lm_head", False) and name == "lm_heads.0.weight":
            loaded["lm_head.weight"] = tensor
        else:
            skipped.append(name)
    for name, tensor in loaded.items():
        if "lm_head" in name and token_map is not None and tensor.shape[0] > token_map.shape[0]:
            loaded[name] = tensor[token_map]
    unloaded = sorted(set(params) - set(loaded))
    assert cfg["truncated_vocab_size"] == cfg["vocab_size"] or token_map is not None  # vLLM asserts this
    if token_map is not None:
        loaded["token_map"] = token_map
    return loaded, skipped, unloaded


def vllm_medusa_logits(cfg: dict, params: dict[str, torch.Tensor], hidden: torch.Tensor) -> torch.Tensor:
    """``Medusa.forward`` then ``compute_logits`` on one device: ``[..., num_heads, vocab]`` (``-inf`` outside a
    token map)."""
    out = []
    for i in range(cfg["num_heads"]):
        x = hidden
        for j in range(cfg["num_hidden_layers"]):
            x = x + F.silu(F.linear(x, params[f"blocks.{i}.layers.{j}.weight"].float(),
                                    params.get(f"blocks.{i}.layers.{j}.bias")))
        lm_head = params["lm_head.weight"] if cfg.get("original_lm_head", False) else params[f"lm_heads.{i}.weight"]
        logits = F.linear(x, lm_head.float()) * cfg.get("logit_scale", 1.0)
        if "token_map" in params:
            full = torch.full((*logits.shape[:-1], cfg["vocab_size"]), -torch.inf)
            full[..., params["token_map"]] = logits
            logits = full
        out.append(logits)
    return torch.stack(out, dim=-2)


def saved(tmp_path, heads, **kwargs):
    heads.save_pretrained(tmp_path, **kwargs)
    return json.loads((tmp_path / "config.json").read_text()), load_file(str(tmp_path / "model.safetensors"))


# ---- what hf-spec writes --------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["full", "shared-lm-head"])
@pytest.mark.parametrize("layers", [1, 2])
def test_saved_config_is_what_vllms_medusa_config_reads(tmp_path, variant, layers):
    raw, _ = saved(tmp_path, random_heads(n=3, layers=layers, variant=variant).bind(tiny_llama(vocab_size=V)))
    assert set(raw) == {"model_type", "architectures", "num_heads", "num_hidden_layers", "hidden_size", "vocab_size",
                        "truncated_vocab_size", "medusa_fc_bias", "original_lm_head", "hf_spec_variant",
                        "base_model_name_or_path"}
    cfg = vllm_config(raw)
    assert cfg["model_type"] == "medusa" and cfg["architectures"] == ["MedusaModel"]
    assert (cfg["num_heads"], cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (3, layers, H, V)
    assert cfg["truncated_vocab_size"] == V  # no token map
    assert cfg["medusa_fc_bias"] is True  # vLLM's default is False: the biases would be skipped
    assert cfg["original_lm_head"] is (variant == "shared-lm-head")
    assert "logit_scale" not in cfg  # 1: hf-spec's heads do not scale their logits


@pytest.mark.parametrize("variant", ["full", "shared-lm-head"])
@pytest.mark.parametrize("layers", [1, 2])
def test_saved_weights_are_exactly_what_vllms_load_weights_consumes(tmp_path, variant, layers):
    raw, weights = saved(tmp_path, random_heads(n=3, layers=layers, variant=variant).bind(tiny_llama(vocab_size=V)))
    cfg = vllm_config(raw)
    loaded, skipped, unloaded = vllm_load_weights(cfg, weights)
    assert skipped == [] and unloaded == []
    shapes = vllm_parameters(cfg)
    assert {name: tuple(t.shape) for name, t in loaded.items()} == shapes
    projections = {name for name in weights if name.startswith("lm_heads.")}
    assert projections == ({"lm_heads.0.weight"} if variant == "shared-lm-head"
                           else {f"lm_heads.{i}.weight" for i in range(3)})


@pytest.mark.parametrize("variant", ["full", "shared-lm-head"])
@pytest.mark.parametrize("layers", [1, 2])
def test_vllms_forward_on_the_saved_file_gives_hf_specs_logits(tmp_path, variant, layers):
    target = tiny_llama(vocab_size=V)
    heads = random_heads(n=4, layers=layers, variant=variant, seed=layers).bind(target)
    raw, weights = saved(tmp_path, heads)
    cfg = vllm_config(raw)
    params, _, _ = vllm_load_weights(cfg, weights)
    for shape in [(7, H), (2, 3, H), (1, H)]:
        hidden = 2 * torch.randn(*shape)
        ours = heads(hidden)
        theirs = vllm_medusa_logits(cfg, params, hidden)
        torch.testing.assert_close(theirs, ours)
        assert torch.equal(theirs.argmax(-1), ours.argmax(-1))  # vLLM drafts each head's argmax
    # the bias flag matters: without it vLLM would compute something else from the same file
    no_bias = {k: v for k, v in params.items() if not k.endswith(".bias")}
    assert not torch.allclose(vllm_medusa_logits(dict(cfg, medusa_fc_bias=False), no_bias, hidden), ours, atol=1e-3)


def test_vllm_with_fewer_speculative_tokens_than_heads(tmp_path):
    """vLLM builds num_speculative_tokens heads (``num_lookahead_tokens`` sets ``num_heads``): with k <= N
    it loads the first k and skips the rest; with k > N heads are left unloaded, which vLLM refuses."""
    raw, weights = saved(tmp_path, random_heads(n=3).bind(tiny_llama(vocab_size=V)))
    _, skipped, unloaded = vllm_load_weights(vllm_config(dict(raw, num_heads=2)), weights)
    assert unloaded == [] and sorted(skipped) == ["blocks.2.layers.0.bias", "blocks.2.layers.0.weight"]
    _, _, unloaded = vllm_load_weights(vllm_config(dict(raw, num_heads=4)), weights)
    assert unloaded == ["blocks.3.layers.0.bias", "blocks.3.layers.0.weight"]


def test_shared_lm_head_copy_is_stored_in_bfloat16_only_when_lossless(tmp_path):
    target = tiny_llama(vocab_size=V)
    heads = random_heads(n=2).bind(target)
    _, weights = saved(tmp_path / "a", heads)
    W = target.get_output_embeddings().weight
    assert weights["lm_heads.0.weight"].dtype == torch.float32 and torch.equal(weights["lm_heads.0.weight"], W)
    with torch.no_grad():
        W.copy_(W.to(torch.bfloat16).float())  # a float32 target loaded from a bfloat16 checkpoint
    raw, weights = saved(tmp_path / "b", heads)
    assert weights["lm_heads.0.weight"].dtype == torch.bfloat16 and torch.equal(weights["lm_heads.0.weight"].float(), W)
    cfg = vllm_config(raw)
    hidden = torch.randn(5, H)
    torch.testing.assert_close(vllm_medusa_logits(cfg, vllm_load_weights(cfg, weights)[0], hidden), heads(hidden))
    assert torch.equal(MedusaHeads.from_pretrained(tmp_path / "b", target=target)(hidden), heads(hidden))


def test_shared_heads_need_the_lm_head_to_be_saved(tmp_path):
    heads = random_heads(n=2)  # not bound
    with pytest.raises(MedusaCheckpointError, match="copy of the target's lm_head"):
        heads.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(MedusaCheckpointError, match=r"\[vocab_size, hidden_size\] = \[48, 32\]"):
        heads.save_pretrained(tmp_path / "out", lm_head=torch.zeros(V, H + 1))
    target = tiny_llama(vocab_size=V)
    _, weights = saved(tmp_path / "out", heads, lm_head=target.get_output_embeddings())
    assert torch.equal(weights["lm_heads.0.weight"], target.get_output_embeddings().weight)
    # full heads carry their own projections and need nothing
    _, weights = saved(tmp_path / "full", random_heads(n=2, variant="full"))
    assert {f"lm_heads.{i}.weight" for i in range(2)} <= set(weights)


def test_stored_lm_head_that_is_not_the_targets_is_reported(tmp_path, caplog):
    """hf-spec projects shared heads with the target's lm_head, vLLM with the stored copy: loading for a
    target of the same size whose lm_head differs warns."""
    target, other = tiny_llama(vocab_size=V, seed=0), tiny_llama(vocab_size=V, seed=1)
    random_heads(n=2).bind(target).save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="hf_spec"):
        MedusaHeads.from_pretrained(tmp_path, target=target)
    assert "differs from the target's" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="hf_spec"):
        MedusaHeads.from_pretrained(tmp_path, target=other)
    assert "differs from the target's" in caplog.text


# ---- vLLM-layout folders from other tools ----------------------------------------------------------
def test_vllm_layout_without_biases_prefixes_or_hf_spec_keys_loads(tmp_path):
    """What vLLM accepts and hf-spec did not write: no block biases (vLLM's default), names prefixed with
    ``medusa_heads.``, FasterDecoding's key for the head count, ``lm_head.weight`` as the shared projection.
    hf-spec computes vLLM's logits from them."""
    torch.manual_seed(0)
    target = tiny_llama(vocab_size=V)
    full = {f"medusa_heads.blocks.{i}.layers.0.weight": 0.3 * torch.randn(H, H) for i in range(2)}
    full |= {f"medusa_heads.lm_heads.{i}.weight": torch.randn(V, H) for i in range(2)}
    shared = {k: v for k, v in full.items() if "blocks" in k} | {"lm_head.weight": target.get_output_embeddings().weight.clone()}
    for name, weights, extra in [("full", full, {}), ("shared", shared, {"original_lm_head": True})]:
        folder = tmp_path / name
        folder.mkdir()
        save_file(weights, str(folder / "model.safetensors"))
        raw = {"model_type": "medusa", "medusa_num_heads": 2, "hidden_size": H, "vocab_size": V, **extra}
        (folder / "config.json").write_text(json.dumps(raw))
        heads = MedusaHeads.from_pretrained(folder, target=target)
        assert heads.config.variant == ("shared-lm-head" if extra else "full")
        cfg = vllm_config(raw)
        params, skipped, unloaded = vllm_load_weights(cfg, weights)
        assert skipped == [] and unloaded == []
        hidden = torch.randn(6, H)
        torch.testing.assert_close(heads(hidden), vllm_medusa_logits(cfg, params, hidden))


@pytest.mark.parametrize("change,message", [
    ({"truncated_vocab_size": 40}, "token_map"),
    ({"logit_scale": 2.0}, "logit_scale 2.0"),
    ({"medusa_fc_bias": False}, "vLLM would drop them"),
    ({"hf_spec_variant": "full"}, "which vLLM reads as 'shared-lm-head'"),
    ({"medusa_num_heads": 3}, "disagree"),
    ({"original_lm_head": "yes"}, "must be true or false"),
])
def test_vllm_layout_that_hf_spec_would_compute_differently_is_refused(tmp_path, change, message):
    random_heads(n=2).bind(tiny_llama(vocab_size=V)).save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(raw | change))
    with pytest.raises(MedusaCheckpointError, match=message):
        MedusaHeads.from_pretrained(tmp_path)


def test_two_shared_projections_are_refused(tmp_path):
    random_heads(n=2).bind(tiny_llama(vocab_size=V)).save_pretrained(tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    weights["lm_head.weight"] = weights["lm_heads.0.weight"].clone()  # vLLM would keep whichever came last
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(MedusaCheckpointError, match=r"found \['lm_heads.0.weight', 'lm_head.weight'\]"):
        MedusaHeads.from_pretrained(tmp_path)


# ---- a token map ----------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["full", "shared-lm-head"])
def test_token_map_is_saved_as_vllm_reads_it(tmp_path, variant):
    """Heads with a token map: vLLM reads truncated_vocab_size from the config, keeps token_map, cuts the
    projections to its rows, and computes hf-spec's logits (``-inf`` outside the map) from the file."""
    target = tiny_llama(vocab_size=V)
    heads = random_heads(n=3, variant=variant, seed=2).bind(target).set_token_map([1, 5, 6, 20, 33, 47])
    raw, weights = saved(tmp_path, heads)
    cfg = vllm_config(raw)
    assert (cfg["truncated_vocab_size"], cfg["vocab_size"]) == (6, V)
    assert weights["token_map"].dtype == torch.int64
    params, skipped, unloaded = vllm_load_weights(cfg, weights)
    assert skipped == [] and unloaded == []
    assert {n: tuple(t.shape) for n, t in params.items() if n != "token_map"} == vllm_parameters(cfg)
    hidden = torch.randn(2, 4, H)
    theirs, ours = vllm_medusa_logits(cfg, params, hidden), heads(hidden)
    torch.testing.assert_close(theirs, ours)
    assert torch.equal(theirs.argmax(-1), ours.argmax(-1))


@pytest.mark.parametrize("edit,message", [
    ("no map", "needs a token_map of 6"),
    ("short map", "needs a token_map of 6"),
    ("repeated id", "repeats"),
    ("short projection", "hf-spec needs all 48 rows"),
])
def test_token_maps_hf_spec_cannot_use_are_refused(tmp_path, edit, message):
    heads = random_heads(n=2, variant="full").set_token_map([1, 5, 6, 20, 33, 47])
    _, weights = saved(tmp_path, heads)
    if edit == "no map":
        del weights["token_map"]
    elif edit == "short map":
        weights["token_map"] = weights["token_map"][:5]
    elif edit == "repeated id":
        weights["token_map"] = torch.tensor([1, 5, 5, 20, 33, 47])
    else:
        weights["lm_heads.1.weight"] = weights["lm_heads.1.weight"][weights["token_map"]]
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(MedusaCheckpointError, match=message):
        MedusaHeads.from_pretrained(tmp_path)


def test_token_map_without_truncation_is_ignored_as_vllm_ignores_it(tmp_path):
    heads = random_heads(n=2, variant="full")
    raw, weights = saved(tmp_path, heads)
    weights["token_map"] = torch.arange(10)
    save_file(weights, str(tmp_path / "model.safetensors"))
    assert vllm_load_weights(vllm_config(raw), weights)[1:] == ([], [])
    assert MedusaHeads.from_pretrained(tmp_path).token_map is None


@pytest.mark.parametrize("truncated", [0, -3, V + 12])
def test_truncated_vocab_size_outside_the_vocabulary_is_refused_as_such(tmp_path, truncated):
    """A truncated_vocab_size that no token map can have (vLLM builds projections of that many rows): the message says
    so, rather than asking for a token_map of 0, -3 or more ids than the vocabulary holds."""
    random_heads(n=2, variant="full").save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(raw | {"truncated_vocab_size": truncated}))
    with pytest.raises(MedusaCheckpointError, match=rf"truncated_vocab_size {truncated} must lie in 1\.\.vocab_size \({V}\)"):
        MedusaHeads.from_pretrained(tmp_path)


def test_shared_projection_cut_to_the_map_is_refused_with_the_reason(tmp_path):
    """The shared-lm-head copy cut to the map's rows gets the same reason as a full head's projection (it got only
    "has shape (6, 32), expected (48, 32)")."""
    heads = random_heads(n=2).bind(tiny_llama(vocab_size=V)).set_token_map([1, 5, 6, 20, 33, 47])
    _, weights = saved(tmp_path, heads)
    weights["lm_heads.0.weight"] = weights["lm_heads.0.weight"][weights["token_map"]]
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(MedusaCheckpointError, match=r"lm_heads\.0\.weight holds 6 rows .*hf-spec needs all 48 rows"):
        MedusaHeads.from_pretrained(tmp_path)
