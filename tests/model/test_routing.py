"""Route capture returns the top-k experts the routers actually chose."""

from __future__ import annotations

import torch

from opencomposer.model.routing import RouteRecorder, moe_routers, route_dtype


def _router_inputs(model, ids):
    """Hidden states entering every router, captured independently of RouteRecorder."""
    seen = []
    handles = [r.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach())) for r in moe_routers(model)]
    with torch.no_grad():
        model(ids)
    for h in handles:
        h.remove()
    return seen


def test_qwen3_routes_are_top_k_of_router_softmax(tiny_moe):
    model, tokenizer = tiny_moe
    ids = torch.tensor([tokenizer.encode("class Stack:\n    def push(self, item):\n        self.items.append(item)\n")])
    with RouteRecorder(model) as recorder, torch.no_grad():
        model(ids)
        routes = recorder.take(*ids.shape)  # [1, T, layers, k]
    routers = moe_routers(model)
    assert routes.shape == (1, ids.shape[1], len(routers), 2)
    for layer, (router, hidden) in enumerate(zip(routers, _router_inputs(model, ids))):
        probs = torch.softmax(hidden.reshape(-1, hidden.shape[-1]) @ router.weight.T, dim=-1)
        expected = probs.topk(router.top_k, dim=-1).indices.sort(dim=-1).values
        assert torch.equal(routes[0, :, layer], expected)


def test_deepseek_routes_respect_group_limits(tiny_deepseek):
    model, tokenizer = tiny_deepseek
    ids = torch.tensor([tokenizer.encode("for i in range(10):\n    print(i)\n")])
    with RouteRecorder(model) as recorder, torch.no_grad():
        model(ids)
        routes = recorder.take(*ids.shape)[0]  # [T, layers, k]
    config = model.config
    assert routes.shape[1] == config.num_hidden_layers - config.first_k_dense_replace
    group = routes // (config.n_routed_experts // config.n_group)
    # topk_group = 1: both experts of a token come from one group
    assert torch.equal(group[..., 0], group[..., 1])


def test_dense_model_records_nothing(smollm2):
    model, tokenizer = smollm2
    with RouteRecorder(model) as recorder, torch.no_grad():
        model(torch.tensor([tokenizer.encode("hi")]))
        assert recorder.take(1, 1) is None
    assert route_dtype(model).itemsize == 1
