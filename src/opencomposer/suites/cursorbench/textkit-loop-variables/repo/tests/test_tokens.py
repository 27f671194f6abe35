import pytest

from textkit.tokens import ngrams, sentences, word_frequencies, words


def test_words_keep_contractions_hyphens_and_numbers():
    text = "Don't stop: well-known rock'n'roll costs 3.14 or 1,000!"
    assert words(text) == ["Don't", "stop", "well-known", "rock'n'roll", "costs", "3.14", "or", "1,000"]


def test_words_lower_and_unicode():
    assert words("Über Café", lower=True) == ["über", "café"]


def test_sentences_split_on_terminal_punctuation():
    text = "It rained. We stayed in! Did it stop? Yes."
    assert sentences(text) == ["It rained.", "We stayed in!", "Did it stop?", "Yes."]


def test_sentences_respect_abbreviations():
    text = "Dr. Watson met Mr. Holmes. They talked, e.g. About crime."
    assert sentences(text) == ["Dr. Watson met Mr. Holmes.", "They talked, e.g. About crime."]


def test_sentences_keep_closing_quotes_and_need_a_capital():
    text = 'He said "Stop." Then he left. version 2.0 is out'
    assert sentences(text) == ['He said "Stop."', "Then he left. version 2.0 is out"]
    assert sentences("see fig. 3 for details. next one") == ["see fig.", "3 for details. next one"]


def test_sentences_of_blank_text():
    assert sentences("   ") == []


def test_ngrams():
    assert ngrams(["a", "b", "c"], 2) == [("a", "b"), ("b", "c")]
    assert ngrams(["a"], 2) == []
    with pytest.raises(ValueError):
        ngrams(["a"], 0)


def test_word_frequencies_fold_case_and_skip_stopwords():
    counts = word_frequencies("The cat and the hat. THE END", stopwords=["and"])
    assert counts.most_common(1) == [("the", 3)]
    assert "and" not in counts
