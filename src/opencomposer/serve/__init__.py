"""The OpenAI-compatible HTTP server behind ``opencomposer serve`` (``serve.server``): any checkpoint
the local sampler loads, answered as the agent harness samples a turn."""
