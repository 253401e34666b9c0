"""The verify-friendly linear layer: same product (float32 rounding only), active only where intended."""

import torch

from hf_spec.kernels import install_upcast_prefill, install_verify_linear, verify_linear

from .conftest import tiny_llama


def test_verify_linear_matches_f_linear_and_is_gated():
    torch.manual_seed(0)
    lin = torch.nn.Linear(1024, 1024)
    ref = {m: lin(torch.ones(m, 1024)) for m in (1, 3, 16, 200)}
    assert install_verify_linear(torch.nn.Sequential(lin)) == 1
    calls = []
    orig_mm = torch.mm

    def spy(*a):
        calls.append(a[0].shape)
        return orig_mm(*a)

    torch.mm = spy
    try:
        x = torch.randn(3, 1024)
        outside = lin(x)
        assert calls == []  # outside the block: exactly F.linear
        with verify_linear():
            inside = lin(x)
            lin(torch.randn(200, 1024))  # more than 128 rows: F.linear
            lin(torch.randn(1, 1024))   # one row: F.linear
        assert len(calls) == 1
    finally:
        torch.mm = orig_mm
    torch.testing.assert_close(inside, outside, rtol=1e-5, atol=1e-5)
    assert torch.equal(lin(torch.ones(200, 1024)), ref[200])


def test_subclasses_of_linear_are_left_alone():
    class QuantLinear(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), QuantLinear(1024, 1024), torch.nn.Linear(8, 8))
    assert install_verify_linear(model) == 1  # the subclass and the small layer keep their forward
    assert "forward" not in vars(model[1]) and "forward" not in vars(model[2])


def test_model_outputs_agree_inside_and_outside():
    model = tiny_llama(seed=2, hidden=1024)
    ids = torch.tensor([[0, 3, 4, 5, 6]])
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        assert install_verify_linear(model) > 0
        with verify_linear():
            got = model(input_ids=ids).logits
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_upcast_prefill_only_for_many_rows():
    lin = torch.nn.Linear(32, 8).to(torch.bfloat16)
    x_small, x_big = torch.randn(4, 32).to(torch.bfloat16), torch.randn(64, 32).to(torch.bfloat16)
    ref_small = lin(x_small)
    install_upcast_prefill(torch.nn.Sequential(lin))
    assert torch.equal(lin(x_small), ref_small)
    exact = torch.nn.functional.linear(x_big.float(), lin.weight.float(), lin.bias.float())
    torch.testing.assert_close(lin(x_big).float(), exact, rtol=1e-2, atol=1e-2)
    assert lin(x_big).dtype == torch.bfloat16


def test_routed_models_still_pickle_and_deep_copy():
    """A model that ran hf-spec keeps its routed linear layers; a bound method there broke pickle.loads (it looks
    the function's name up on the module) and copies. The copy must route through its own weights."""
    import copy
    import pickle

    for install, dtype in ((install_verify_linear, torch.float32), (install_upcast_prefill, torch.bfloat16)):
        model = torch.nn.Sequential(torch.nn.Linear(1024, 1024)).to(dtype)
        assert install(model) == 1
        x = torch.randn(64, 1024, dtype=dtype)
        for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
            with torch.no_grad():
                clone[0].weight.mul_(2)
                with verify_linear():
                    assert torch.allclose(clone(x).float(), torch.nn.functional.linear(
                        x.float(), clone[0].weight.float(), clone[0].bias.float()), rtol=2e-2, atol=2e-2)
                    assert not torch.allclose(clone(x).float(), model(x).float(), rtol=2e-2, atol=2e-2)
