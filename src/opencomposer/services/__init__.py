"""Long-running services over the library: the four services of asynchronous RL (docs/services.md:
``reconciler``, ``inference``, ``episodes`` (the episode workers), ``evaluation``, the rollout
source ``async_rl.AsyncRollouts`` that drives them, the ``weights`` store, the Ray backend
``ray_backend``). The OpenAI-compatible server behind ``opencomposer serve`` is its own package,
``serve``.

A service owns a process's lifetime (sockets, threads, shutdown); what it serves is built from the
layers below it, never reimplemented here.
"""
