"""Models: loading, saving, tokenizer, routing capture. Heavy imports happen on first use."""

__all__ = ["load_model", "save_checkpoint", "parameter_counts", "default_tokenizer"]


def __getattr__(name: str):
    if name in __all__:
        from opencomposer.model import loading

        return getattr(loading, name)
    raise AttributeError(f"module 'opencomposer.model' has no attribute {name!r}")
