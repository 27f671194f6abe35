"""The code corpus is deterministic and its held-out split is stable."""

from __future__ import annotations

import pytest

from opencomposer.config import ConfigError, CorpusConfig
from opencomposer.model.corpus import build_corpus, is_heldout


def test_same_config_same_files():
    a = build_corpus(CorpusConfig(max_files=200), seed=3)
    b = build_corpus(CorpusConfig(max_files=200), seed=3)
    assert [f.name for f in a.train] == [f.name for f in b.train]
    assert [f.name for f in a.heldout] == [f.name for f in b.heldout]
    c = build_corpus(CorpusConfig(max_files=200), seed=4)
    assert [f.name for f in a.train] != [f.name for f in c.train]


def test_heldout_is_disjoint_and_decided_by_name(code_corpus):
    train = {f.name for f in code_corpus.train}
    heldout = {f.name for f in code_corpus.heldout}
    assert train and heldout and not train & heldout
    assert all(is_heldout(name, 0.02) for name in heldout)
    assert not any(is_heldout(name, 0.02) for name in train)
    assert 0.005 < len(heldout) / (len(heldout) + len(train)) < 0.05


def test_files_respect_size_and_sources(code_corpus):
    from opencomposer.model.corpus import project_of

    assert {f.source for f in code_corpus.train} == {"stdlib", "site-packages"}
    assert {project_of(f.path) for f in code_corpus.train if f.source == "site-packages"} == {"torch"}  # the default
    assert all(200 <= len(f.text.encode()) <= 200_000 for f in code_corpus.train)


def test_folder_source(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n" * 50)
    (tmp_path / "pkg" / "tiny.py").write_text("y = 2\n")
    (tmp_path / "pkg" / "latin1.py").write_bytes(b"s = '\xe9'\n" * 50)
    corpus = build_corpus(CorpusConfig(sources=[str(tmp_path)], heldout_fraction=0.0))
    assert [f.path for f in corpus.train] == ["pkg/a.py"]  # too small and non-UTF-8 files skipped


def test_bad_source_is_named():
    with pytest.raises(ConfigError, match="'/no/such/dir' is neither"):
        build_corpus(CorpusConfig(sources=["/no/such/dir"]))


def test_packages_narrow_site_packages_and_fix_the_corpus():
    """Named packages: site-packages gives only their files, so the corpus is the same whatever else
    is installed (control: without the list, site-packages files of other packages come in)."""
    from opencomposer.model.corpus import corpus_versions, project_of

    config = CorpusConfig(sources=["stdlib", "site-packages"], packages=["pytest", "_pytest"], max_files=400)
    corpus = build_corpus(config)
    projects = {project_of(f.path) for f in corpus.train + corpus.heldout if f.source == "site-packages"}
    assert projects and projects <= {"pytest", "_pytest"}
    assert {f.source for f in corpus.train} == {"stdlib", "site-packages"}
    everything = build_corpus(CorpusConfig(sources=["site-packages"], packages=[], max_files=100))
    assert {project_of(f.path) for f in everything.train} - {"pytest", "_pytest"}  # the control
    versions = corpus_versions(config)
    assert versions["python"].startswith("3.") and versions["pytest"].count(".") >= 1


def test_fingerprint_names_the_data():
    a = build_corpus(CorpusConfig(max_files=50), seed=3)
    assert a.fingerprint() == build_corpus(CorpusConfig(max_files=50), seed=3).fingerprint()
    assert a.fingerprint() != build_corpus(CorpusConfig(max_files=50), seed=4).fingerprint()
    from dataclasses import replace

    changed = replace(a, train=[replace(a.train[0], text=a.train[0].text + "\n"), *a.train[1:]])
    assert changed.fingerprint() != a.fingerprint()  # one byte of one file


def test_bad_packages_are_named():
    with pytest.raises(ConfigError, match="no usable .py files of 'no_such_package_xyz'"):
        build_corpus(CorpusConfig(sources=["site-packages"], packages=["no_such_package_xyz"]))
    assert build_corpus(CorpusConfig(sources=["stdlib"], packages=["no_such_package_xyz"], max_files=5)).train
    with pytest.raises(ConfigError, match="not a top-level package"):
        CorpusConfig(sources=["site-packages"], packages=["torch/nn"]).validate()
