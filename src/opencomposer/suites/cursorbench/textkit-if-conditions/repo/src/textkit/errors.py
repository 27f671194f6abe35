"""Errors raised by textkit's template engine."""


class TemplateError(Exception):
    """Base class for template errors."""


class TemplateSyntaxError(TemplateError):
    """A template that cannot be parsed; ``line`` is 1-based."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(f"line {line}: {message}")
        self.message = message
        self.line = line


class UndefinedError(TemplateError):
    """A variable that is not in the context, raised only by strict templates."""
