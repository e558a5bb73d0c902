"""NOTE [Attention masks of all ones] in monet_opt/ones_masks.py: an HF decoder given a mask with
no padding trains as eager, which drops such a mask; padded batches plan a step of their own."""
from __future__ import annotations

import copy
import logging
import warnings

import torch

import monet_opt
from monet_opt.module import ReplanWarning
from tests.test_progress import told


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=97, max_position_embeddings=64, use_cache=False,
        attention_dropout=0.0))


def _batch(padded: bool) -> dict:
    ids = torch.randint(3, 97, (4, 16))
    mask = torch.ones(4, 16, dtype=torch.long)
    if padded:
        mask[1, 12:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.clone()}


def _as_eager(opt, model, eager, batches) -> list:
    """A step of each batch, ours and eager's, every gradient bitwise alike; the
    ReplanWarnings ours raised."""
    replans = []
    for seed, batch in enumerate(batches):
        grads = []
        for module, owner in ((opt, model), (eager, eager)):
            owner.zero_grad(set_to_none=True)
            torch.manual_seed(seed)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                module(**batch).loss.backward()
            replans += [w for w in caught if issubclass(w.category, ReplanWarning)]
            grads.append([p.grad for p in owner.parameters()])
        assert all(torch.equal(a, b) for a, b in zip(*grads)), seed
    return replans


def test_all_ones_and_padded_masks_train_as_eager():
    """With the mask all ones, 13 of the 21 gradients were 1.1e-8 from eager's (the step ran
    SDPA with the explicit mask eager drops). The check's time is in the progress log."""
    model = _llama().train()
    eager = copy.deepcopy(model)
    torch.manual_seed(1)
    batches = [_batch(False), _batch(True), _batch(False)]
    with told(logging.INFO) as said:
        opt = monet_opt.optimize(model, batches[0], 1 << 40, profile_dir=None,
                                 profile_repeats=1)
    assert any("attention_mask all ones treated as None: left out in" in m for m in said)
    assert len(_as_eager(opt, model, eager, batches)) == 1  # the padded batch's step, once


def test_a_mask_of_another_rank_is_passed_as_it_is():
    """An all-True 4-d mask (every token sees every token) was dropped as a padding mask:
    Llama ran causal attention, 0.24 from eager's."""
    model = _llama().train()
    eager = copy.deepcopy(model)
    torch.manual_seed(1)
    opt = monet_opt.optimize(model, _batch(False), 1 << 40, profile_dir=None,
                             profile_repeats=1)
    ids = torch.randint(3, 97, (2, 16))
    full = torch.ones(2, 1, 16, 16, dtype=torch.bool)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReplanWarning)
        ours = opt(input_ids=ids, attention_mask=full).logits
    assert torch.equal(ours, eager(input_ids=ids, attention_mask=full).logits)


def test_a_padded_sample_decides_at_the_first_all_ones_batch():
    """A padded sample decided nothing: the model's all-ones batches ran with the mask, 1.9e-8
    from eager's. The first such call checks and plans the step for None, once."""
    model = _llama().train()
    eager = copy.deepcopy(model)
    torch.manual_seed(1)
    batches = [_batch(True), _batch(False), _batch(False), _batch(True)]
    opt = monet_opt.optimize(model, batches[0], 1 << 40, profile_dir=None, profile_repeats=1)
    assert len(_as_eager(opt, model, eager, batches)) == 1  # the all-ones batches' step, once


def test_a_padded_sample_under_new_shapes_error_keeps_the_mask():
    """A module that plans no new structure runs all-ones batches with the mask, as planned."""
    model = _llama().train()
    torch.manual_seed(1)
    opt = monet_opt.optimize(model, _batch(True), 1 << 40, profile_dir=None,
                             profile_repeats=1, new_shapes="error")
    opt(**_batch(False)).loss.backward()
    assert len(opt.plans) == 1


def test_a_mask_left_out_is_counted_as_the_callers():
    """The step planned without an all-ones mask left it out of its memory, though the caller
    holds it: at a byte limit of its own prediction the plan measured the mask's bytes over."""
    model = _llama().train()
    torch.manual_seed(1)
    batch = _batch(False)
    store_all = monet_opt.optimize(model, batch, 1 << 40, profile_dir=None, profile_repeats=1)
    limit = store_all.plan.predicted_peak_bytes
    opt = monet_opt.optimize(model, batch, limit, profile_dir=None, profile_repeats=1)
    model.zero_grad(set_to_none=True)
    peak = monet_opt.measure_peak(lambda: opt(**batch).loss.backward(),
                                  monet_opt.resident_tensors(model, batch))
    # its peak is in the forward, before the loss's seed gradient: NOTE [The loss scalar]
    assert peak <= limit and 0 <= opt.plan.predicted_peak_bytes - peak <= 4


def test_a_hook_added_since_sees_the_mask():
    """A forward pre-hook added after optimize() that edits the mask (a masking augmentation)
    was handed None on every all-ones batch (the decision, made with no hooks, held for good):
    gradients 0.042 from eager's on GPT-2, silently. Decided under the hooks it was made with,
    the mask reaches the hook, and with the hook removed it is left out again."""
    model = _llama().train()
    eager = copy.deepcopy(model)
    torch.manual_seed(1)
    batch = _batch(False)
    opt = monet_opt.optimize(model, batch, 1 << 40, profile_dir=None, profile_repeats=1)

    def hide_first(module, args, kwargs):
        if kwargs.get("attention_mask") is not None:
            kwargs["attention_mask"] = kwargs["attention_mask"].clone()
            kwargs["attention_mask"][:, :4] = 0
        return args, kwargs

    handles = [m.model.register_forward_pre_hook(hide_first, with_kwargs=True)
               for m in (model, eager)]
    _as_eager(opt, model, eager, [batch])
    for handle in handles:
        handle.remove()
    assert not _as_eager(opt, model, eager, [batch])  # the first plan's step again


def test_a_model_that_registers_hooks_at_its_first_forward_runs_the_samples_plan():
    """Mixtral recording its router logits registers forward hooks at its first forward (the
    check's): the decision, made under none, held for no call, and the sample's first call
    planned again with the mask, its prediction not opt.plan's."""
    from transformers import MixtralConfig, MixtralForCausalLM
    torch.manual_seed(0)
    model = MixtralForCausalLM(MixtralConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=64, output_router_logits=True,
        use_cache=False)).train()
    eager = copy.deepcopy(model)
    torch.manual_seed(1)
    batch = _batch(False)
    opt = monet_opt.optimize(model, batch, 1 << 40, profile_dir=None, profile_repeats=1)
    assert not _as_eager(opt, model, eager, [batch, batch]) and len(opt.plans) == 1


def test_a_mask_passed_by_position_is_left_out_as_by_keyword():
    """NOTE [Arguments passed as the sample's]: opt(ids, mask) is passed on as the sample's
    keywords, so its all-ones mask is left out as theirs is."""
    model = _llama().train()
    eager = copy.deepcopy(model)
    torch.manual_seed(1)
    batch = _batch(False)
    opt = monet_opt.optimize(model, batch, 1 << 40, profile_dir=None, profile_repeats=1)
    grads = []
    for module, owner in ((opt, model), (eager, eager)):
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ReplanWarning)
            module(batch["input_ids"], batch["attention_mask"], labels=batch["labels"]) \
                .loss.backward()
        grads.append([p.grad for p in owner.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads)) and len(opt.plans) == 1
