"""One target forward over a draft tree (issue 22): every node's logits equal those of a plain forward over the
prefix and that node's root path, for full and sliding-window attention (past the window), sdpa and eager, a
batch whose rows carry different trees; after keep_path the cache holds exactly the accepted path."""

import pytest
import torch

from hf_spec.ragged import RaggedCache

from .conftest import tiny_llama
from .test_sliding_window import tiny_mistral

#: two trees over 6 nodes (parents; -1 = the root) and their tokens
TREES = [([-1, -1, 0, 0, 2, 1], [5, 9, 3, 7, 11, 4]),
         ([-1, 0, 1, -1, 3, 3], [8, 8, 2, 6, 10, 12])]


def _reference(model, ids: list[int]) -> torch.Tensor:
    """The logits after ``ids``, from a plain forward without a cache."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]


def _root_path(parents, j):
    path = []
    while j >= 0:
        path.append(j)
        j = parents[j]
    return path[::-1]


@pytest.mark.parametrize("make", [lambda: tiny_llama(), lambda: tiny_mistral(4)], ids=["llama", "mistral-window-4"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_tree_forward_equals_each_root_path_and_keep_path_keeps_it(make, attn, attention_path):
    on, packed = attention_path
    if attn == "eager" and on:
        pytest.skip("eager attention has one path: transformers'")
    model = make()
    model.set_attn_implementation(attn)
    prompts = [[0, 5, 9, 5, 9, 5, 3, 7], [0, 7, 3, 7, 3, 2, 4, 6]]
    ragged = RaggedCache(model.config, 2, "cpu")
    with torch.no_grad():
        ragged.forward(model, torch.tensor([p[:-1] for p in prompts]))  # the cache holds all but the root
        parents = torch.tensor([t[0] for t in TREES])
        tokens = torch.tensor([t[1] for t in TREES])
        block = torch.cat([torch.tensor([[p[-1]] for p in prompts]), tokens], dim=1)
        out = ragged.forward(model, block, logits_to_keep=block.shape[1], parents=parents)
    assert bool(packed) == on  # the tree's 7 positions attended packed on hf-spec's path
    for b, (par, tok) in enumerate(TREES):
        torch.testing.assert_close(out.logits[b, 0], _reference(model, prompts[b]), atol=1e-4, rtol=1e-4)
        for j in range(len(par)):
            ids = prompts[b] + [tok[i] for i in _root_path(par, j)]
            torch.testing.assert_close(out.logits[b, j + 1], _reference(model, ids), atol=1e-4, rtol=1e-4)
    # accept node 4's path in row 0 (nodes 0, 2, 4) and nothing in row 1; then one more token each
    path = torch.tensor([[0, 2, 4], [-1, -1, -1]])
    ragged.keep_path(torch.tensor([3, 0]), path)
    assert ragged.lengths.tolist() == [len(prompts[0]) + 3, len(prompts[1])]
    with torch.no_grad():
        nxt = ragged.forward(model, torch.tensor([[13], [14]]))
    torch.testing.assert_close(nxt.logits[0, -1], _reference(model, prompts[0] + [5, 3, 11, 13]), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(nxt.logits[1, -1], _reference(model, prompts[1] + [14]), atol=1e-4, rtol=1e-4)


def test_filler_nodes_and_refused_attention():
    model = tiny_llama()
    ragged = RaggedCache(model.config, 1, "cpu")
    with torch.no_grad():
        ragged.forward(model, torch.tensor([[0, 5, 9]]))
        block, parents = torch.tensor([[3, 4, 6, 0]]), torch.tensor([[-1, 0, 99]])  # node 2 is filler
        out = ragged.forward(model, block, torch.tensor([[True, True, True, False]]), logits_to_keep=4, parents=parents)
    torch.testing.assert_close(out.logits[0, 2], _reference(model, [0, 5, 9, 3, 4, 6]), atol=1e-4, rtol=1e-4)
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        RaggedCache(model.config, 1, "cpu").forward(model, torch.tensor([[1, 2]]), parents=torch.tensor([[-1]]))
