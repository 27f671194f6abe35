"""``opencomposer basecheck`` (``bench.basecheck``): the three base-model checks of docs/recipe.md §2.

Fast tests pin each measurement against an independent computation on a tiny random model (the
rolling NLL against direct forwards, the cached candidate scores against full forwards), the
edit distance on known strings, the generators' determinism and that every answer and every final
file follows from its source, the JSON and table of the command, and its refusals of bad input.
The slow test is the issue's requirement: on all three checks SmolLM2-135M beats a briefly
pretrained tiny MoE, which beats an untrained one.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

from opencomposer.bench import basecheck
from opencomposer.bench.basecheck import common, fresh, nll, state
from opencomposer.cli import build_parser, main
from opencomposer.config import BasecheckConfig, ModelConfig, load_recipe
from opencomposer.model.loading import load_model, save_checkpoint
from tests.conftest import skip_missing

SMALL = dict(kind="tiny_moe", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
             num_experts=2, top_k=1, moe_intermediate_size=32)
TEXT = "def add(a, b):\n    return a + b\n\n\nclass Box:\n    size = 3\n" * 3


@pytest.fixture(scope="module")
def small(tiny_tokenizer):
    return load_model(ModelConfig(**SMALL), tiny_tokenizer, seed=1)


def _ids(tokenizer, text: str) -> list[int]:
    return [common.start_id(tokenizer), *tokenizer(text, add_special_tokens=False)["input_ids"]]


@torch.no_grad()
def _next_token_nll(model, context: list[int], target: int) -> float:
    logits = model(input_ids=torch.tensor([context])).logits[0, -1].float()
    return -logits.log_softmax(-1)[target].item()


# ----------------------------------------------------------------------------------------------
# Codebase NLL


@pytest.mark.parametrize("n, window, stride", [(2, 2, 1), (10, 4, 2), (31, 8, 3), (50, 16, 8), (7, 64, 32)])
def test_rolling_windows_score_every_token_once_with_enough_context(n, window, stride):
    scored = []
    for begin, end, first in nll.rolling_windows(n, window, stride):
        assert end - begin <= window and begin < first
        for j in range(first, end):
            scored.append(j)
            assert j - begin >= min(j, window - stride)  # the promised context
    assert scored == list(range(1, n))


def test_rolling_nll_equals_one_full_forward_when_the_text_fits(small):
    model, tokenizer = small
    ids = _ids(tokenizer, TEXT)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    reference = -logits.log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None]).sum().item()
    result = nll.rolling_nll(model, tokenizer, TEXT, window=len(ids) + 5)
    assert result.windows == 1 and result.tokens == len(ids) - 1
    assert result.bytes == len(TEXT.encode())
    assert result.nll == pytest.approx(reference, rel=1e-5)
    assert result.per_byte == pytest.approx(reference / len(TEXT.encode()), rel=1e-5)


def test_rolling_nll_with_stride_one_equals_per_token_forwards(small):
    """Stride 1: every token after the first window is predicted from exactly ``window - 1`` tokens."""
    model, tokenizer = small
    text = TEXT[:60]
    ids, window = _ids(tokenizer, text), 6
    reference = sum(_next_token_nll(model, ids[max(0, j - window + 1) : j], ids[j]) for j in range(1, len(ids)))
    assert len(ids) > 2 * window
    assert nll.rolling_nll(model, tokenizer, text, window=window, stride=1).nll == pytest.approx(reference, rel=1e-5)


def test_repository_text_is_the_files_in_path_order(tmp_path):
    (tmp_path / "b.py").write_text("b = 2")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "z.py").write_text("z = 1\n")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.pyc").write_bytes(b"\0junk")
    (tmp_path / "blob.bin").write_bytes(b"\0\1\2")
    text, paths = nll.repository_text(tmp_path)
    assert paths == ["a/z.py", "b.py"] and text == "z = 1\nb = 2\n"
    assert nll.repository_text(tmp_path, max_bytes=8)[0] == "z = 1\n"  # cut at a line end


# ----------------------------------------------------------------------------------------------
# State tracking


@pytest.mark.parametrize("a, b, expected", [("kitten", "sitting", 3 / 7), ("same", "same", 0.0), ("", "", 0.0),
                                            ("", "abc", 1.0), ("abc", "xyz", 1.0), ("flaw", "lawn", 2 / 4)])
def test_edit_distance_on_known_strings(a, b, expected):
    assert state.edit_distance(a, b) == pytest.approx(expected)
    assert state.edit_distance(b, a) == pytest.approx(expected)


def test_generated_histories_are_deterministic_and_replay_to_the_final_file():
    first = state.generated_histories(6, 3, seed=0, max_prompt_chars=1600, max_final_chars=600)
    again = state.generated_histories(6, 3, seed=0, max_prompt_chars=1600, max_final_chars=600)
    other = state.generated_histories(6, 3, seed=1, max_prompt_chars=1600, max_final_chars=600)
    assert [h.versions for h in first] == [h.versions for h in again] != [h.versions for h in other]
    for history in first:
        assert len(history.versions) >= 2 and len(history.final) <= 600
        assert state.replay(history) == history.final
        prompt = state.history_prompt(history)
        assert len(prompt) <= 1600
        assert prompt.startswith(f"The history of the file `{history.path}`")
        assert prompt.endswith(f"Final content of `{history.path}`:\n```python\n")
        assert prompt.count("```diff\n") == len(history.versions)
        assert "--- /dev/null\n" in prompt.split("```diff\n")[1]  # the first diff creates the file
        assert history.final not in prompt.split("```diff\n")[-1]  # 1 line of context: not in the last diff


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(repo), *args],
                   check=True, capture_output=True)


def test_git_histories_follow_renames_and_replay(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    steps = ["def f():\n    return 1\n", "def f():\n    return 2\n", "def f(x):\n    return 2 * x\n"]
    for n, text in enumerate(steps):
        (repo / "old.py").write_text(text)
        (repo / "other.txt").write_text(f"note {n}\n")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"step {n}")
    _git(repo, "mv", "old.py", "new.py")
    _git(repo, "commit", "-q", "-m", "rename")
    (repo / "new.py").write_text("def f(x):\n    return 3 * x\n")
    _git(repo, "commit", "-q", "-am", "last")
    assert state.file_history(repo, "new.py") == [*steps, "def f(x):\n    return 3 * x\n"]
    histories = state.git_histories(repo, 5, max_prompt_chars=1600, max_final_chars=600)
    assert {h.path for h in histories} == {"new.py", "other.txt"}
    assert all(state.replay(h) == h.final == (repo / h.path).read_text() for h in histories)
    short = state.fit_history(state.FileHistory("x", "new.py", state.file_history(repo, "new.py")), 420)
    assert short is not None and len(state.history_prompt(short)) <= 420 and short.final.startswith("def f(x)")


def test_greedy_completion_stops_at_the_budget(small):
    model, tokenizer = small
    out = state.greedy_completion(model, tokenizer, "def f(", max_new_tokens=5)
    assert len(tokenizer(out, add_special_tokens=False)["input_ids"]) <= 6


# ----------------------------------------------------------------------------------------------
# FreshBench-like QA


def _function_source(source: str, question: fresh.Question) -> list[str]:
    tree = ast.parse(source)
    name = question.subject.split(".")[-1]
    return [ast.get_source_segment(source, node) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name]


def _textual_check(question: fresh.Question) -> bool:
    """The answer, found in the file's text with a regular expression (not the generator's ast walk)."""
    source = Path(question.file).read_text(encoding="utf-8")
    answer = re.escape(question.answer)
    if question.kind == "default":
        pattern = rf"\b{re.escape(question.parameter)}\s*(:[^=]*)?=\s*{answer}\s*[,)]"
        return any(re.search(pattern, segment.split(":\n")[0] + ")") for segment in _function_source(source, question))
    if question.kind == "base":
        return re.search(rf"class {re.escape(question.subject)}\(\s*{answer}\s*[,)]", source) is not None
    if question.kind == "raises":
        return any(re.search(rf"raise {answer}\b", segment) for segment in _function_source(source, question))
    callers = [ast.get_source_segment(source, node) for node in ast.walk(ast.parse(source))
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == question.answer]
    return any(re.search(rf"\b{re.escape(question.subject)}\s*\(", segment) for segment in callers)


def test_questions_are_deterministic_and_verifiable_from_the_source():
    questions = fresh.generate_questions(16, seed=0)
    assert [(q.kind, q.module, q.subject, q.candidates) for q in questions] == \
        [(q.kind, q.module, q.subject, q.candidates) for q in fresh.generate_questions(16, seed=0)]
    assert [q.subject for q in questions] != [q.subject for q in fresh.generate_questions(16, seed=1)]
    assert sorted({q.kind for q in questions}) == sorted(fresh.KINDS)
    for q in questions:
        assert len(q.candidates) == 4 == len(set(q.candidates)) and q.answer not in q.distractors
        assert q.prompt.startswith(f"# {q.package} {q.version}, {q.module}\n") and len(q.prompt) <= 1200
        assert fresh.verify_question(q), q
        assert _textual_check(q), q


def test_a_wrong_answer_fails_verification():
    q = fresh.generate_questions(4, seed=3, packages=["rich"])[0]
    swapped = fresh.Question(**{**q.__dict__, "answer_index": (q.answer_index + 1) % len(q.candidates)})
    assert fresh.verify_question(q) and not fresh.verify_question(swapped)


def test_cached_candidate_scores_equal_full_forwards(small):
    model, tokenizer = small
    prompt, continuations = "def f(a, b=", ["None,", "0,", "'utf-8',"]
    scores = fresh.continuation_logprobs(model, tokenizer, prompt, continuations)
    prompt_ids = _ids(tokenizer, prompt)
    for text, score in zip(continuations, scores):
        cont = tokenizer(text, add_special_tokens=False)["input_ids"]
        reference = -sum(_next_token_nll(model, prompt_ids + cont[:i], cont[i]) for i in range(len(cont)))
        assert score == pytest.approx(reference, rel=1e-4, abs=1e-4)


# ----------------------------------------------------------------------------------------------
# The command


def _argv(out: Path, *models: str, extra: tuple[str, ...] = ()) -> list[str]:
    argv = ["basecheck", "--out", str(out), "--window", "32", "--nll-bytes", "300", "--histories", "1",
            "--questions", "4", "--package", "rich", *extra]
    for model in models:
        argv += ["--model", model]
    return argv


def test_command_writes_the_three_keys_per_model_and_a_table(tmp_path, capsys, monkeypatch, tiny_tokenizer):
    # the table folds a long checkpoint path over lines at the terminal's width, which could split
    # the folder name this test looks for, depending on how long pytest's temporary path is
    monkeypatch.setenv("COLUMNS", "400")
    folders = [str(save_checkpoint(*load_model(ModelConfig(**SMALL), tiny_tokenizer, seed=seed), tmp_path / f"m{seed}"))
               for seed in (2, 3)]
    out = tmp_path / "results" / "basecheck.json"
    assert main(_argv(out, *folders)) == 0
    printed = capsys.readouterr().out
    results = json.loads(out.read_text())
    assert list(results) == folders
    for spec, row in results.items():
        assert set(row) == {"codebase_nll_per_byte", "state_tracking_distance", "freshbench_accuracy", "detail"}
        assert row["codebase_nll_per_byte"] > 0 and 0 <= row["state_tracking_distance"] <= 1
        assert 0 <= row["freshbench_accuracy"] <= 1
        assert set(row["detail"]["codebase_nll"]["repos"]) == {"ledger", "scheduler"}
        assert row["detail"]["codebase_nll"]["window"] == 32
        assert len(row["detail"]["freshbench"]["questions"]) == 4
        assert Path(spec).name in printed
    assert "NLL/byte" in printed and "Fresh acc" in printed and f"results: {out}" in printed


def test_flags_are_the_basecheck_section_of_the_recipe(tmp_path):
    """Every flag is ``--set basecheck.FIELD``; a list flag, repeated, is the whole list; a recipe's
    ``[basecheck]`` is read, and a flag after it wins; the help text is the field's docstring."""
    parser = build_parser()
    recipe = tmp_path / "r.toml"
    recipe.write_text("[basecheck]\nwindow = 128\nquestions = 8\nnll_repos = ['x']\n")
    args = parser.parse_args(["basecheck", "--model", "tiny_moe", "--out", "o.json", "--recipe", str(recipe),
                              "--nll-repo", "a", "--questions", "4", "--nll-repo", "b", "--device", "cpu"])
    settings = load_recipe(args.recipe, args.overrides).basecheck
    assert (settings.window, settings.questions, settings.nll_repos, settings.device) == (128, 4, ["a", "b"], "cpu")
    assert load_recipe(None, ["basecheck.packages=['rich']"]).basecheck.packages == ["rich"]
    help = parser._subparsers._group_actions[0].choices["basecheck"].format_help()
    assert "FreshBench-like questions, a quarter of each kind. Default 48" in " ".join(help.split())


@pytest.mark.parametrize("models, extra, message", [
    (["gpt5"], (), "--model gpt5: no such folder, and not a model kind (tiny_moe"),
    (["/no/such/model"], (), "--model /no/such/model: no such folder"),
    (["tiny_moe", "tiny_moe"], (), "--model: given more than once: tiny_moe"),
    (["tiny_moe"], ("--nll-repo", "/no/such/repo"), "--nll-repo /no/such/repo: not a folder"),
    (["tiny_moe"], ("--package", "no-such-dist-xyz"), "--package no-such-dist-xyz: not installed"),
    (["tiny_moe"], ("--questions", "-1"), "questions: must be >= 0"),
    (["tiny_moe"], ("--window", "1"), "window: a window of 1 token has no context"),
])
def test_bad_input_is_refused_before_any_model_loads(tmp_path, capsys, models, extra, message):
    assert main(_argv(tmp_path / "out.json", *models, extra=extra)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_folders_that_are_not_models_or_repositories_are_refused(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(_argv(tmp_path / "out.json", str(tmp_path / "empty"))) == 2
    assert "not a checkpoint folder (no config.json)" in capsys.readouterr().err
    assert main(_argv(tmp_path / "out.json", "tiny_moe", extra=("--history-repo", str(tmp_path / "empty")))) == 2
    assert "not a git work tree" in capsys.readouterr().err
    assert main(_argv(tmp_path, "tiny_moe")) == 2
    assert f"--out {tmp_path}: is a folder; expected a file path" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# The requirement: SmolLM2 > pretrained tiny > untrained tiny, on all three checks


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ran past the suite's 900 s beside the tiny-long pipeline (2026-12-07)
def test_smollm2_beats_pretrained_tiny_beats_untrained_tiny(tmp_path):
    from opencomposer.config import load_recipe
    from opencomposer.model.smollm2 import smollm2_path
    from opencomposer.pretrain.cpt import run_pretraining

    if os.environ.get("OPENCOMPOSER_OFFLINE") == "1" and not (smollm2_path() / "model.safetensors").is_file():
        skip_missing(f"SmolLM2 is not cached at {smollm2_path()} and OPENCOMPOSER_OFFLINE=1 forbids fetching it")
    # the project's pretraining, as `opencomposer pretrain --recipe recipes/quickstart.toml` runs it, shortened
    # the quickstart's pretraining stage (600 steps of a ~386k-parameter MoE, one thread); a loose
    # time cap so the step count, not the machine's load, decides the model
    config = load_recipe("recipes/quickstart.toml", [f"run.out_dir={json.dumps(str(tmp_path))}", 'run.name="tiny"',
                                                     "pretrain.max_steps=600", "pretrain.max_minutes=30"])
    _, _, result, checkpoint = run_pretraining(config, progress=False)
    assert result.steps == 600 and result.last_loss < result.first_loss
    settings = BasecheckConfig(window=256, nll_bytes=12_000, histories=6, questions=96, device="cpu", threads=1)
    results = basecheck.run_basecheck(["smollm2", str(checkpoint), "tiny_moe"], settings)
    smol, pretrained, untrained = (results[k] for k in ("smollm2", str(checkpoint), "tiny_moe"))
    summary = {k: {m: v[m] for m in ("codebase_nll_per_byte", "state_tracking_distance", "freshbench_accuracy")}
               for k, v in results.items()}
    assert smol["codebase_nll_per_byte"] < pretrained["codebase_nll_per_byte"] < untrained["codebase_nll_per_byte"], summary
    assert smol["state_tracking_distance"] < pretrained["state_tracking_distance"] < untrained["state_tracking_distance"], summary
    assert smol["freshbench_accuracy"] > pretrained["freshbench_accuracy"] > untrained["freshbench_accuracy"], summary
