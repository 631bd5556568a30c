"""The conformance table's MoE scenario: a tiny Qwen3-MoE causal LM (transformers' own, 4
experts, top-2, its default ``router_aux_loss_coef`` of 0.001) whose loss adds the router's
load-balancing loss to the token cross-entropy.

The ground truth is the large batch's loss as the model itself defines it: the window's mean
token cross-entropy plus the coefficient times the load-balancing loss of the whole window (that
loss is a product of two batch means, not a sum over tokens, so the window's is not the mean of
the micro-batches'). :func:`moe_loss` returns it in the library's contract (summed, count), so
``full_batch_gradients`` of the window is that large batch's gradient.

:func:`decompose` splits a framework's update in two by running it again with the coefficient
set to 0 (gradients are linear in the loss; the routing does not depend on the coefficient): the
token cross-entropy part against the truth's, and the auxiliary part's weight, its projection on
the large batch's auxiliary update divided by that update's squared norm (1: the large batch's
weight; k: added once per micro-batch, unscaled).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from gradaccum_lib.batches import concatenate_micro_batches
from gradaccum_lib.equivalence import full_batch_gradients
from gradaccum_lib.losses import cross_entropy_sum

from .scenarios import LEARNING_RATE

__all__ = ["EXPERTS", "TOP_K", "decompose", "make_tiny_moe", "moe_loss", "step_function"]

EXPERTS, TOP_K = 4, 2


def make_tiny_moe(vocabulary: int, length: int, coefficient: float) -> nn.Module:
    """A 1-layer Qwen3-MoE causal LM (float64, eager experts and attention), the same weights
    every call, that returns its router logits and adds ``coefficient`` times their
    load-balancing loss to its loss."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=vocabulary, hidden_size=8, intermediate_size=16, moe_intermediate_size=8,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
        num_experts=EXPERTS, num_experts_per_tok=TOP_K, max_position_embeddings=length,
        output_router_logits=True, router_aux_loss_coef=coefficient,
        experts_implementation="eager", attn_implementation="eager")
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(config).to(torch.float64)


def moe_loss(model: nn.Module, batch: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
    """The truth's loss: the summed next-token cross-entropy plus the coefficient times the
    batch's load-balancing loss times the token count (so that summed / count is the model's
    own large-batch loss), and the token count."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    output = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   output_router_logits=True)
    summed, count = cross_entropy_sum(output.logits[:, :-1], batch["labels"][:, 1:])
    auxiliary = load_balancing_loss_func(output.router_logits, EXPERTS, TOP_K,
                                         batch["attention_mask"])
    return summed + model.router_aux_loss_coef * auxiliary * count, count


def step_function(framework: str, accumulation_steps: int):  # noqa: ANN201
    """The framework's step function, as its column runs it (no clipping, sequential order)."""
    if framework == "trainer":
        from ..hf_trainer import hf_trainer_step

        return hf_trainer_step(accumulation_steps, shuffle=False)
    if framework == "accelerate":
        from ..frameworks import accelerate_step

        return accelerate_step(accumulation_steps)
    if framework == "lightning":
        from .lightning import fit_step

        return fit_step(accumulation_steps, 0.0, {})
    if framework == "trl":
        from .trl import sft_step

        return sft_step(accumulation_steps)
    raise ValueError(f"framework must be trainer, accelerate, lightning or trl; got {framework!r}")


def _vector(model: nn.Module) -> Tensor:
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])


def _updates(step, model: nn.Module, micro_batches: list) -> tuple[Tensor, Tensor]:  # noqa: ANN001
    """The framework's update from ``model`` and the large batch's (SGD, lr 0.1)."""
    from .scenarios import make_optimizer

    candidate = copy.deepcopy(model)
    step(candidate, micro_batches, make_optimizer)
    gradients = full_batch_gradients(model, moe_loss, concatenate_micro_batches(micro_batches))
    truth = torch.cat([gradients[name].reshape(-1).double()
                       for name, _ in model.named_parameters()])
    return _vector(candidate) - _vector(model), -LEARNING_RATE * truth


def decompose(framework: str, scenario) -> dict[str, float]:  # noqa: ANN001
    """Return the cross-entropy part's relative error against the truth's, and the auxiliary
    part's weight and relative error against the large batch's auxiliary update."""
    if scenario.max_grad_norm:  # the split is linear; a clip is not
        raise ValueError(f"decompose needs an unclipped scenario; {scenario.key} clips at "
                         f"{scenario.max_grad_norm}")
    parts = scenario.micro_batches()
    step = step_function(framework, scenario.accumulation_steps)
    with_aux, truth = _updates(step, scenario.model(), parts)
    without = scenario.model()
    without.router_aux_loss_coef = without.config.router_aux_loss_coef = 0.0  # forward, TRL
    ce_only, ce_truth = _updates(step, without, parts)
    aux, aux_truth = with_aux - ce_only, truth - ce_truth
    return {"ce_relative_error": float((ce_only - ce_truth).norm() / ce_truth.norm()),
            "aux_weight": float(aux @ aux_truth / (aux_truth @ aux_truth)),
            "aux_relative_error": float((aux - aux_truth).norm() / aux_truth.norm())}
