"""Long-running services over the library: the four services of asynchronous RL (docs/services.md:
``reconciler``, ``inference``, ``environments``, ``evaluation``, the driver ``async_rl``, the
``weights`` store, the Ray backend ``ray_backend``). The OpenAI-compatible server behind
``opencomposer serve`` is its own package, ``serve``.

A service owns a process's lifetime (sockets, threads, shutdown); what it serves is built from the
layers below it, never reimplemented here.
"""
