"""Long-running services over the library: today the OpenAI-compatible server behind
``opencomposer serve`` (``services.openai_server``); the asynchronous RL services (reconciler,
inference and environment workers, trainer, weight store) are to come.

A service owns a process's lifetime (sockets, threads, shutdown); what it serves is built from the
layers below it, never reimplemented here.
"""
