"""**Codebase NLL** (``codebase_nll_per_byte``, lower is better). A held-out repository's files
(by default the held-out source projects, ``tasks.heldout_projects``: ``ledger`` and
``scheduler``, which no pretraining corpus here contains) are read as ``read_tree`` reads a
source (caches and VCS folders skipped), UTF-8 text files only, concatenated in alphabetical path
order, each ending with a newline. The text is tokenised once, preceded by the model's document
separator (``<|endoftext|>``, as between pretraining documents) so that the first byte is
predicted too, and scored with a rolling window: windows of ``window`` tokens start every
``stride`` tokens (default ``window // 2``), and each token is scored once, in the first window
that reaches it, so every token after the first window sees at least ``window - stride`` tokens
of context. The summed negative log-likelihood (nats) is divided by the text's UTF-8 bytes, so
models with different tokenizers compare. Over several repositories: total nats / total bytes
(``codebase_nll``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opencomposer.bench.basecheck.common import BasecheckError, heldout_project_roots, model_device, start_id


def repository_text(root: Path | str, max_bytes: int = 0) -> tuple[str, list[str]]:
    """The UTF-8 text files of a repository, in alphabetical path order, concatenated (each ending
    with a newline); cut at a line end within ``max_bytes`` when given. Also the paths used."""
    from opencomposer.tasks.generators.source import SourceError, read_tree

    try:
        tree = read_tree(Path(root))
    except SourceError as e:
        raise BasecheckError(f"--nll-repo {root}: not a folder") from e
    parts, paths = [], []
    for rel in sorted(tree):
        data = tree[rel]
        if b"\0" in data:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if text.strip():
            parts.append(text if text.endswith("\n") else text + "\n")
            paths.append(rel)
    text = "".join(parts)
    if not text:
        raise BasecheckError(f"--nll-repo {root}: no UTF-8 text files to score")
    if max_bytes and len(text.encode()) > max_bytes:
        cut = text.encode()[:max_bytes].decode("utf-8", errors="ignore")
        text = cut[: cut.rfind("\n") + 1] or cut
    return text, paths


@dataclass
class NllResult:
    nll: float  # summed negative log-likelihood, nats
    tokens: int  # tokens scored (the text's tokens; the start token is context only)
    bytes: int  # UTF-8 bytes of the text
    windows: int

    @property
    def per_byte(self) -> float:
        return self.nll / self.bytes


def rolling_windows(num_ids: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """``(begin, end, first_scored)`` per window over ids ``[0, num_ids)``: the window feeds
    ``ids[begin:end]`` and scores the targets ``first_scored .. end - 1`` (target j is predicted
    from ``ids[begin:j]``). Target 0 (the start token) is never scored; each other target once."""
    if window < 2 or not 0 < stride < window:
        raise BasecheckError(f"window {window} and stride {stride}: need window >= 2 and 0 < stride < window")
    spans, scored_up_to, begin = [], 1, 0
    while scored_up_to < num_ids:
        end = min(begin + window, num_ids)
        if end > scored_up_to:
            spans.append((begin, end, scored_up_to))
            scored_up_to = end
        begin += stride
    return spans


def rolling_nll(model: Any, tokenizer: Any, text: str, window: int, stride: int = 0,
                progress: bool = False, label: str = "codebase NLL") -> NllResult:
    """Summed NLL of ``text`` under a rolling window (module doc); ``stride`` 0 = ``window // 2``."""
    import torch

    from opencomposer.training.progress import ProgressBar

    stride = stride or max(window // 2, 1)
    ids = [start_id(tokenizer), *tokenizer(text, add_special_tokens=False)["input_ids"]]
    spans = rolling_windows(len(ids), window, stride)
    device, total = model_device(model), 0.0
    with torch.no_grad(), ProgressBar(label, len(spans), status="{nats:.3f} nats/byte so far",
                                      enabled=progress) as bar:
        done_bytes = 0
        for n, (begin, end, first) in enumerate(spans, 1):
            x = torch.tensor([ids[begin:end]], device=device)
            # the logits at positions first-1 .. end-2 predict the targets first .. end-1
            logits = model(input_ids=x, use_cache=False, logits_to_keep=end - first + 1).logits[0, :-1].float()
            targets = x[0, first - begin : end - begin]
            total -= logits.log_softmax(-1).gather(1, targets[:, None]).sum().item()
            done_bytes += len(tokenizer.decode(ids[first:end]).encode())
            bar.update(n, nats=total / max(done_bytes, 1))
    return NllResult(nll=total, tokens=len(ids) - 1, bytes=len(text.encode()), windows=len(spans))


def codebase_nll(model: Any, tokenizer: Any, repos: list[tuple[str, str]], window: int, stride: int = 0,
                 progress: bool = False) -> dict[str, Any]:
    """Total nats / total bytes over ``repos`` (name, text), with the per-repository numbers."""
    per_repo, nll, num_bytes = {}, 0.0, 0
    for name, text in repos:
        result = rolling_nll(model, tokenizer, text, window, stride, progress, label=f"NLL {name}")
        per_repo[name] = {"nll_per_byte": result.per_byte, "bits_per_byte": result.per_byte / math.log(2),
                          "nats": result.nll, "bytes": result.bytes, "tokens": result.tokens,
                          "windows": result.windows, "bytes_per_token": result.bytes / max(result.tokens, 1)}
        nll += result.nll
        num_bytes += result.bytes
    return {"nll_per_byte": nll / num_bytes, "bits_per_byte": nll / num_bytes / math.log(2),
            "window": window, "stride": stride or max(window // 2, 1), "repos": per_repo}



def repository_texts(repos: list[str], max_bytes: int = 0) -> list[tuple[str, str]]:
    """(name, text) of every repository to score: ``repos``, or the held-out projects when empty. A
    folder whose name an earlier one has is named by its whole path."""
    texts: list[tuple[str, str]] = []
    for root in [Path(r).expanduser() for r in repos] or heldout_project_roots():
        name = root.name if root.name not in {n for n, _ in texts} else str(root)
        texts.append((name, repository_text(root, max_bytes)[0]))
    return texts
