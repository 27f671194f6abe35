"""Small text utilities: tokens, slugs, identifier case, wrapping and a template engine."""

from .case import detect_case, split_words, to_camel, to_constant, to_kebab, to_pascal, to_snake
from .errors import TemplateError, TemplateSyntaxError, UndefinedError
from .filters import register
from .slug import slugify, unique_slug
from .template import Template, render
from .tokens import ngrams, sentences, word_frequencies, words
from .wrapping import display_width, fill, fill_paragraphs, justify, shorten, wrap

__all__ = [
    "Template",
    "TemplateError",
    "TemplateSyntaxError",
    "UndefinedError",
    "detect_case",
    "display_width",
    "fill",
    "fill_paragraphs",
    "justify",
    "ngrams",
    "register",
    "render",
    "sentences",
    "shorten",
    "slugify",
    "split_words",
    "to_camel",
    "to_constant",
    "to_kebab",
    "to_pascal",
    "to_snake",
    "unique_slug",
    "word_frequencies",
    "words",
    "wrap",
]
