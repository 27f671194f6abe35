"""Generated recall sources (``opencomposer.pretrain.recall``): documents that teach copying from
the context, which a phase lists as ``"copy"`` / ``"recall"`` beside the corpus's sources. They
must copy exactly in token space, never leak the retrieval probe's words or held-out code, be a
pure function of the seed, train only where a phase lists them, and (slow) actually teach the tiny
MoE to copy."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from opencomposer.config import ConfigError, load_recipe
from opencomposer.model.corpus import CodeFile, Corpus
from opencomposer.pretrain.recall import (
    APPEND_ITEMS,
    APPEND_LABELS,
    APPEND_STEPS,
    PROBE_WORDS,
    append_documents,
    copy_documents,
    identifiers,
    recall_documents,
    with_recall_sources,
    word_pieces,
)
from opencomposer.pretrain.recall import SOURCES as GENERATED

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "src" / "opencomposer"
SMALL_MODEL = ["model.hidden_size=32", "model.num_layers=2", "model.head_dim=8", "model.num_experts=4",
               "model.moe_intermediate_size=32"]


def _corpus() -> Corpus:
    files = [CodeFile("pkg", str(p.relative_to(SOURCES)), p.read_text()) for p in sorted(SOURCES.rglob("*.py"))]
    return Corpus(train=[f for f in files if not f.path.startswith("rl/")],
                  heldout=[f for f in files if f.path.startswith("rl/")])


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_copy_document_repeats_the_same_tokens(tiny_tokenizer):
    """The premise of the ``copy`` source: the second span is token for token the first, so the
    second half is predictable by copying and by nothing else."""
    pieces = word_pieces(tiny_tokenizer)
    assert len(pieces) > 500 and all(p.isascii() and p.isalpha() for p in pieces)
    docs = copy_documents(pieces, 200, seed=0)
    assert {d.source for d in docs} == {"copy"}
    for doc in docs:
        first, second, tail = doc.text.split("\n")
        assert first == second and tail == ""
        ids = _ids(tiny_tokenizer, doc.text)
        span = _ids(tiny_tokenizer, first + "\n")
        assert ids == span + span
        assert len(ids) <= 64  # a whole document fits the first phase's row


def test_recall_documents_plant_facts_and_repeat_spans_across_training_code(tiny_tokenizer):
    corpus = _corpus()
    docs = recall_documents(corpus.train, word_pieces(tiny_tokenizer), 100, seed=0)
    train_text = "\n".join(f.text for f in corpus.train)
    planted = [d for d in docs if d.text.split("\n")[0].endswith('"')]
    repeated = [d for d in docs if d not in planted]
    assert len(planted) == len(repeated) == 50
    for doc in planted:
        lines = doc.text.split("\n")
        name, value = lines[0].split(" = ")
        assert lines[-2] == f"assert {name} == {value}" and lines[-1] == ""
        gap = "\n".join(lines[1:-2])
        assert gap in train_text  # the code between is held-in code, never held-out
    for doc in repeated:
        lines = doc.text.split("\n")
        assert lines[0] == lines[-2] and "\n".join(lines[1:-2]) in train_text
    gaps = sorted(len("\n".join(d.text.split("\n")[1:-2])) for d in docs)
    assert gaps[10] < 100 and gaps[-1] > 500  # distances from a few tokens to a few hundred


def test_the_recall_gap_is_configurable(tiny_tokenizer):
    corpus = _corpus()
    pieces = word_pieces(tiny_tokenizer)

    def gaps(gap_chars):
        docs = recall_documents(corpus.train, pieces, 200, seed=0, gap_chars=gap_chars)
        return [len("\n".join(d.text.split("\n")[1:-2])) for d in docs]

    short, wide = gaps(60), gaps(4000)
    longest_line = max(len(line) for f in corpus.train for line in f.text.splitlines())
    assert max(short) <= 60 + longest_line  # the budget is reached within one more line
    assert max(wide) > 1500 and np.median(wide) > np.median(short)
    with pytest.raises(ValueError, match="at least 10"):
        recall_documents(corpus.train, pieces, 2, seed=0, gap_chars=5)
    with pytest.raises(ConfigError, match="recall_gap_chars"):
        load_recipe(None, ["pretrain.recall_gap_chars=3"])


def test_append_documents_extend_a_list_with_a_labelled_word(tiny_tokenizer):
    """Each assignment of an ``append`` chain is the previous one with the labelled word added:
    copying the previous assignment gets every token but the new word, which only the label's
    line between them holds."""
    corpus = _corpus()
    train_text = "\n".join(f.text for f in corpus.train)
    docs = append_documents(corpus.train, 200, seed=0)
    sizes, chains = set(), set()
    for doc in docs:
        lines = doc.text.split("\n")
        assert lines[-1] == ""
        name = lines[0].split(" = ")[0]
        assigned = [i for i, line in enumerate(lines) if line.startswith(f"{name} = ")]
        assert assigned[0] == 0 and assigned[-1] == len(lines) - 2
        sizes.add(len(lines[0].split(" = ")[1].strip('"').split()))
        chains.add(len(assigned) - 1)
        for i, j in zip(assigned, assigned[1:]):
            before = lines[i].split(" = ")[1].strip('"').split()
            after = lines[j].split(" = ")[1].strip('"').split()
            assert after[:-1] == before and after[-1] not in before  # the same list, one word more
            between = lines[i + 1:j]
            marked = [line for line in between if re.fullmatch(rf"({'|'.join(APPEND_LABELS)}): {after[-1]}", line)]
            assert len(marked) == 1 and all(line in train_text for line in between if line not in marked)
            tokens_old, tokens_new = _ids(tiny_tokenizer, lines[i]), _ids(tiny_tokenizer, lines[j])
            assert tokens_new[: len(tokens_old) - 1] == tokens_old[:-1] or not before  # copying carries the prefix
    assert sizes == set(range(APPEND_ITEMS[0], APPEND_ITEMS[1] + 1))
    assert chains == set(range(APPEND_STEPS[0], APPEND_STEPS[1] + 1))
    with pytest.raises(ValueError, match="at least 10"):
        append_documents(corpus.train, 2, seed=0, gap_chars=5)


def test_nothing_generated_names_the_probe(tiny_tokenizer):
    corpus = _corpus()
    poisoned = [*corpus.train, CodeFile("pkg", "poison.py", " ".join(f"{w} = probe_{w}" for w in PROBE_WORDS))]
    pieces = word_pieces(tiny_tokenizer)
    words = identifiers([poisoned[-1], *poisoned])
    assert not any(w in PROBE_WORDS or "probe" in w for w in words)
    for doc in (copy_documents(pieces, 300, seed=1) + recall_documents(poisoned, pieces, 300, seed=1)
                + append_documents(poisoned, 300, seed=1)):
        head = doc.text.split("\n")[0].lower()  # what a document asks to recall
        assert "probe" not in head and not any(w in head for w in PROBE_WORDS)


def test_generated_sources_are_a_pure_function_of_the_seed(tiny_tokenizer):
    corpus = _corpus()
    one = with_recall_sources(corpus, tiny_tokenizer, {"copy", "recall", "append"}, 50, seed=3)
    again = with_recall_sources(corpus, tiny_tokenizer, {"copy", "recall", "append", "pkg"}, 50, seed=3)
    other = with_recall_sources(corpus, tiny_tokenizer, {"copy", "recall", "append"}, 50, seed=4)
    assert one.train == again.train and one.train != other.train
    assert one.heldout == corpus.heldout and one.train[: len(corpus.train)] == corpus.train
    assert [sum(f.source == s for f in one.train) for s in GENERATED] == [50, 50, 50]
    assert with_recall_sources(corpus, tiny_tokenizer, {"pkg"}, 50, seed=3) is corpus  # nothing listed, nothing added


def test_a_corpus_source_named_like_a_generated_one_is_refused(tmp_path: Path, tiny_tokenizer):
    from opencomposer.pretrain.phases import run_phases

    corpus = _corpus()
    clash = Corpus(train=[*corpus.train, CodeFile("copy", "x.py", "x = 1\n")], heldout=corpus.heldout)
    config = load_recipe(None, [*SMALL_MODEL, f"run.out_dir={tmp_path}", "run.threads=1",
                                'pretrain.phases=[{seq_len=32, steps=2, batch_size=2}]'])
    with pytest.raises(ConfigError, match=r"\['copy'\] is the name of a generated source"):
        run_phases(config, clash, tiny_tokenizer, progress=False, probes=0)
    with pytest.raises(ConfigError, match="pretrain.recall_documents: must be >= 1"):
        load_recipe(None, ["pretrain.recall_documents=0"])


def test_generated_sources_train_where_listed_and_stay_out_of_the_natural_mix(tmp_path: Path, tiny_tokenizer):
    from opencomposer.pretrain.phases import run_phases

    phases = ('pretrain.phases=[{name="copying", seq_len=32, steps=4, batch_size=4, warmup_steps=1, '
              'sources=["copy", "recall", "pkg"], weights=[0.4, 0.4, 0.2]}, '
              '{name="natural", seq_len=32, steps=3, batch_size=4, warmup_steps=1}]')
    config = load_recipe(None, [*SMALL_MODEL, f"run.out_dir={tmp_path}", "run.name=r", "run.threads=1",
                                "pretrain.eval_every=100", "pretrain.eval_batches=1", "pretrain.recall_documents=64",
                                phases])
    run_phases(config, _corpus(), tiny_tokenizer, progress=False, probes=0)
    mix = json.loads((tmp_path / "r" / "mix.json").read_text())
    assert set(mix["copying"]) == {"copy", "recall", "pkg"} and all(v > 0 for v in mix["copying"].values())
    assert set(mix["natural"]) == {"pkg"}
    corpus_report = json.loads((tmp_path / "r" / "corpus.json").read_text())
    assert set(corpus_report["mix"]) == {"pkg"}  # the corpus report is the corpus's, before generation


def test_the_append_probe_asks_for_the_marked_word_where_copying_says_stop(tiny_moe):
    """An append probe's answer is the word its ``key:`` line marks, at the place where the list
    it copies goes on with the closing quote: a model that only copies gets it wrong."""
    from opencomposer.pretrain.evaluation import append_probe_documents, retrieval_probe

    model, tiny_tokenizer = tiny_moe
    corpus = _corpus()
    probes = append_probe_documents(tiny_tokenizer, corpus.heldout, 256, 12, seed=0)
    assert len(probes) == 12 and append_probe_documents(tiny_tokenizer, corpus.heldout, 256, 12, seed=0) == probes
    quote = _ids(tiny_tokenizer, '"\n')
    sizes = set()
    for ids, answer, distance in probes:
        assert len(ids) == 256 + 1 and 100 < distance < answer  # the inputs: all but the last token
        text = tiny_tokenizer.decode(ids[1:])
        first, *_, last = text.split("\n")
        name, listed = first.split(" = ")
        words = listed.strip('"').split()
        new = tiny_tokenizer.decode(ids[answer:]).strip()
        assert new in PROBE_WORDS and new not in words and text.count(f"key: {new}\n") == 1
        assert last == f'{name} = "{" ".join([*words, new])}'  # the list copied, then the new word
        opening = ids[1 : 1 + len(_ids(tiny_tokenizer, first)) - 1]  # the first assignment's tokens, no quote
        assert ids[answer - len(opening) : answer] == opening  # copying it predicts the next token is...
        assert ids[1 + len(opening) : 1 + len(opening) + len(quote)] == quote  # ...the closing quote
        sizes.add(len(words))
    assert sizes == {1, 2, 3, 4}
    scores = retrieval_probe(model, probes)
    assert set(scores) == {"accuracy", "first_token", "logprob", "distance"} and scores["logprob"] < 0
    with pytest.raises(ValueError, match="cannot hold"):
        append_probe_documents(tiny_tokenizer, corpus.heldout, 12, 1)


def test_the_copy_probe_asks_for_a_span_again_that_no_training_document_holds(tiny_moe, tmp_path: Path):
    """``probe_copy``: a span, a newline, the same span's tokens as the answer; drawn from a stream
    of its own (none is a training document of the run's seed); reported when a phase trains the
    ``copy`` source, not otherwise."""
    from opencomposer.pretrain.evaluation import copy_probe_documents, probe_sets, retrieval_probe
    from opencomposer.pretrain.plan import plan_phases

    model, tiny_tokenizer = tiny_moe
    probes = copy_probe_documents(tiny_tokenizer, 16, seed=3)
    assert len(probes) == 16 and copy_probe_documents(tiny_tokenizer, 16, seed=3) == probes
    trained = {d.text.split("\n")[0] for d in copy_documents(word_pieces(tiny_tokenizer), 5000, 3)}
    newline = _ids(tiny_tokenizer, "\n")
    for ids, answer, distance in probes:
        span = ids[answer:]
        assert ids[1:answer] == span + newline and distance == answer - 1
        assert tiny_tokenizer.decode(span) not in trained
    scores = retrieval_probe(model, probes)
    assert set(scores) == {"accuracy", "first_token", "logprob", "distance"}
    config = load_recipe(None, ['pretrain.phases=[{steps=1, seq_len=64, sources=["copy"], weights=[1]}, '
                                '{steps=1, seq_len=128}]'])
    assert "probe_copy" in probe_sets(_corpus(), tiny_tokenizer, plan_phases(config.pretrain.phases), 4, 0)
    without = load_recipe(None, ["pretrain.phases=[{steps=1, seq_len=64}, {steps=1, seq_len=128}]"])
    assert "probe_copy" not in probe_sets(_corpus(), tiny_tokenizer, plan_phases(without.pretrain.phases), 4, 0)


def test_a_phase_draws_the_documents_made_with_its_own_gap(tiny_tokenizer):
    """``pretrain.phases.recall_gap_chars``: a phase with a gap of its own draws generated documents
    made with that gap; the others, and the natural files, stay as they were."""
    from opencomposer.pretrain.data import generated_corpora

    corpus = _corpus()
    config = load_recipe(None, ["pretrain.recall_documents=30", "pretrain.recall_gap_chars=900",
                                'pretrain.phases=[{steps=1, sources=["recall", "pkg"], weights=[1, 1]}, '
                                '{steps=1, sources=["append", "copy"], weights=[1, 1], recall_gap_chars=40}, '
                                '{steps=1, sources=["recall", "append"], weights=[1, 1], append_gap_chars=60}, '
                                '{steps=1}]'])
    corpora = generated_corpora(corpus, tiny_tokenizer, config.pretrain, seed=2)
    assert set(corpora) == {(900, 900), (40, 40), (900, 60)}
    generated = {gaps: [f for f in c.train if f.source in GENERATED] for gaps, c in corpora.items()}
    assert {f.source for f in generated[900, 900]} == {"recall"}
    assert {f.source for f in generated[40, 40]} == {"append", "copy"}
    assert [f for f in generated[40, 40] if f.source == "append"] == append_documents(corpus.train, 30, 2, 40)
    assert [f for f in generated[900, 60] if f.source == "append"] == append_documents(corpus.train, 30, 2, 60)
    assert ([f for f in generated[900, 60] if f.source == "recall"]
            == [f for f in generated[900, 900] if f.source == "recall"])  # the recall documents keep their gap
    assert all(c.heldout == corpus.heldout and c.train[: len(corpus.train)] == corpus.train for c in corpora.values())
    for name in ("recall_gap_chars", "append_gap_chars"):
        with pytest.raises(ConfigError, match=rf"pretrain.phases\[0\].{name}"):
            load_recipe(None, [f"pretrain.phases=[{{steps=1, {name}=5}}]"])


def test_a_phase_training_the_append_source_reports_the_append_probe(tmp_path: Path, tiny_tokenizer):
    from opencomposer.pretrain.phases import run_phases

    phases = ('pretrain.phases=[{seq_len=64, steps=2, batch_size=2, warmup_steps=1}, '
              '{seq_len=96, steps=2, batch_size=2, warmup_steps=1, sources=["append", "pkg"], weights=[0.5, 0.5], '
              'recall_gap_chars=40}]')
    config = load_recipe(None, [*SMALL_MODEL, f"run.out_dir={tmp_path}", "run.name=r", "run.threads=1",
                                "pretrain.eval_every=100", "pretrain.eval_batches=1", "pretrain.recall_documents=16",
                                "pretrain.recall_gap_chars=200", phases])
    _, _, result = run_phases(config, _corpus(), tiny_tokenizer, progress=False, probes=2)
    evals = [r for r in result.history if r["kind"] == "eval"]
    assert {"probe_append_96_first_token", "probe_append_96_accuracy", "probe_long_first_token"} <= set(evals[-1])
    assert not any(key.startswith("probe_append_64") for key in evals[-1])  # no phase trains it at 64


# the probe recipe of docs/pretraining.md ("The retrieval probe"): three layers, a copy phase, a code
# phase with the generated sources in the mix, a long-context extension. The code phase is 3,000
# steps: at 1,500 the test passed with the libraries of 2026-12-05 and failed with those of
# 2026-12-07 (the probe at most 0.06 for 1,500 steps into the phase, then climbing to 0.69):
# copying forms at a phase transition, and 1,500 sat on its edge (docs/pretraining.md)
PROBE_MODEL = ["model.num_layers=3", "model.num_mtp_layers=0"]
PROBE_MIX = 'sources=["stdlib", "recall", "copy"], weights=[0.3, 0.5, 0.2]'
PROBE_EXTENSION_STEPS = 3000
PROBE_PHASES = (
    '[{name="copy", seq_len=64, steps=2000, batch_size=16, lr=3e-3, warmup_steps=30, schedule="constant", '
    'sources=["copy"], weights=[1.0]}, '
    f'{{name="main", seq_len=64, steps=3000, batch_size=16, lr=3e-3, warmup_steps=10, {PROBE_MIX}}}, '
    f'{{name="long-context", seq_len=256, steps=EXTENSION, batch_size=8, lr=3e-3, warmup_steps=10, rope_theta=1e5, '
    f'{PROBE_MIX}}}]'
)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 25-35 minutes on the busy 2-core machine
def test_the_retrieval_probe_passes_at_lengths_only_the_extension_trained(tmp_path: Path):
    """The long-context claim of issue 15, measured (about 25 minutes on one thread). After the
    64-token phases the model fetches the start of a value planted ~40 tokens earlier, but nothing of
    one planted ~230 tokens earlier (positions it never trained); after the 256-token extension it
    fetches that too: the first token in most probes, the whole 6-8-token value in a quarter to
    two fifths of them (docs/pretraining.md, "The retrieval probe": 0.25-0.41 exact over three runs,
    32 probes each; the bar is 0.125, clear of 0 and of that noise)."""
    from opencomposer.model.corpus import build_corpus
    from opencomposer.pretrain.evaluation import probe_documents, retrieval_probe
    from opencomposer.pretrain.phases import run_phases

    config = load_recipe(ROOT / "recipes" / "pretrain-phases.toml", [
        f"run.out_dir={tmp_path}", "corpus.sources=['stdlib']", "corpus.max_files=1500", "run.threads=1",
        "pretrain.checkpoint_every=0", "pretrain.eval_every=500", *PROBE_MODEL,
        "pretrain.phases=" + PROBE_PHASES.replace("EXTENSION", str(PROBE_EXTENSION_STEPS))])
    pc = config.pretrain
    corpus = build_corpus(config.corpus, seed=config.run.seed, dedup=pc.dedup,
                          near_duplicate_threshold=pc.near_duplicate_threshold, heldout_by=pc.heldout_by)
    model, tokenizer, result = run_phases(config, corpus, progress=False, probes=32)
    after_main, after_extension = result.phases[1].evals[-1], result.phases[2].evals[-1]
    print({k: (round(after_main[k], 3), round(after_extension[k], 3)) for k in after_main if "probe" in k})
    far = retrieval_probe(model, probe_documents(tokenizer, corpus.heldout, 512, 32, config.run.seed))
    print("512 tokens, no phase trained:", far)  # recorded in docs/pretraining.md, not asserted
    assert after_main["probe_short_first_token"] >= 0.5  # the copying skill, within the first phases' length
    assert after_main["probe_long_accuracy"] == 0.0 and after_main["probe_long_first_token"] <= 0.1
    assert after_extension["probe_long_first_token"] >= 0.5 and after_extension["probe_long_accuracy"] >= 0.125
    assert after_extension["probe_long_logprob"] > after_main["probe_long_logprob"] + 3.0
    assert after_extension["probe_short_accuracy"] >= 0.5
