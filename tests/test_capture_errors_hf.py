"""Transformer models a traced step cannot hold as built (a mask checked by its values, a
generation cache, experts looped over) are refused before tracing, saying what to change."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import monet_opt

HUGE = 1 << 40


class _Seq2Seq(nn.Module):
    def __init__(self, say_causal: bool) -> None:
        super().__init__()
        self.say_causal = say_causal
        self.t = nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                dim_feedforward=32, dropout=0.0, batch_first=True)

    def forward(self, src, tgt):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        causal = {"tgt_is_causal": True} if self.say_causal else {}
        return self.t(src, tgt, tgt_mask=mask, **causal)


def test_a_transformer_mask_checked_by_its_values_says_to_say_it_is_causal():
    """nn.Transformer given a tgt_mask and no tgt_is_causal compares the mask's values with a
    causal one; the CaptureError pointed at the user's call and spoke of .item(). Now it says
    to pass tgt_is_causal, and with it the model is optimized."""
    torch.manual_seed(0)
    x = (torch.randn(2, 6, 16), torch.randn(2, 5, 16))
    with pytest.raises(monet_opt.CaptureError, match="tgt_is_causal=True"):
        monet_opt.optimize(_Seq2Seq(False), x, HUGE, profile_repeats=1, profile_dir=None)
    opt = monet_opt.optimize(_Seq2Seq(True), x, HUGE, profile_repeats=1, profile_dir=None)
    assert opt(*x).shape == (2, 5, 16)


def test_a_cache_returned_for_generation_says_to_turn_it_off():
    """A decoder built from its config returns its generation cache (use_cache=True); the
    CaptureError spoke of .item() and a pytree to register, with use_cache=False among three
    generic hints. It now names the cache and says to turn it off, and doing so optimizes."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16,
                     bos_token_id=1, eos_token_id=2)
    model, ids = GPT2LMHeadModel(cfg).train(), torch.randint(0, 50, (2, 8))
    x = {"input_ids": ids, "labels": ids}
    with pytest.raises(monet_opt.CaptureError, match=r"DynamicCache.*use_cache = False"):
        monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None)
    model.config.use_cache = False
    monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None)(**x).loss.backward()


class _HandedACache(torch.nn.Module):
    """As peft's prefix tuning calls Llama: a cache handed in, returned with use_cache off."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, ids):
        from transformers import DynamicCache
        return self.model(input_ids=ids, labels=ids, use_cache=False,
                          past_key_values=DynamicCache(config=self.model.config))


def test_a_cache_handed_in_says_to_return_the_loss():
    """With use_cache already off, the error said to set it off (peft probe, 2026-12-06): the
    cache is one the model was handed, and a module returning the loss alone optimizes."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(num_hidden_layers=1, hidden_size=16, intermediate_size=32,
                      num_attention_heads=2, num_key_value_heads=1, vocab_size=50,
                      use_cache=False)
    model, ids = LlamaForCausalLM(cfg).train(), torch.randint(0, 50, (2, 8))
    with pytest.raises(monet_opt.CaptureError) as err:
        monet_opt.optimize(_HandedACache(model), ids, HUGE, profile_repeats=1, profile_dir=None)
    said = str(err.value).split("What to try:")[1]
    assert "with use_cache off: one it was handed" in said and "use_cache = False" not in said


def test_a_cache_kept_on_by_a_submodules_config_says_where():
    """T5's decoder keeps a copy of the config: with model.config.use_cache off it still
    returns its cache, and was said to be handed one. It names the decoder's config, and
    use_cache=False in the call, as the message says, trains."""
    from transformers import T5Config, T5ForConditionalGeneration
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(T5Config(
        num_layers=1, num_decoder_layers=1, d_model=16, d_ff=32, num_heads=2, d_kv=8,
        vocab_size=50, decoder_start_token_id=0, pad_token_id=0)).train()
    model.config.use_cache = False
    ids = torch.randint(0, 50, (2, 8))
    x = {"input_ids": ids, "labels": ids}
    with pytest.raises(monet_opt.CaptureError, match=r"decoder\.config\.use_cache is on"):
        monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None)
    x["use_cache"] = False
    monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None)(**x).loss.backward()


@pytest.mark.parametrize("impl", ["eager", "grouped_mm"])
def test_experts_looped_over_say_which_implementation_traces(impl):
    """transformers' "eager" mixture of experts loops over the experts hit, a number of the
    batch's values: the error said to avoid data-dependent Python. It names the config's
    experts_implementation now; "grouped_mm" trains bitwise like eager."""
    from transformers import MixtralConfig, MixtralForCausalLM
    torch.manual_seed(0)
    cfg = MixtralConfig(vocab_size=50, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
                        use_cache=False, experts_implementation=impl)
    model, x = MixtralForCausalLM(cfg).train(), {"input_ids": torch.randint(3, 50, (2, 8))}
    if impl == "eager":
        with pytest.raises(monet_opt.CaptureError, match='experts_implementation="grouped_mm"'):
            monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None)
        return
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None)
    opt(**x).logits.square().sum().backward()
    eager(**x).logits.square().sum().backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                           eager.parameters()))


def test_experts_of_a_class_taking_no_implementation_are_not_told_to_set_one():
    """JetMoE was told to set experts_implementation="grouped_mm", which its class refuses
    (ValueError: does not support setting experts implementation)."""
    from transformers import JetMoeConfig, JetMoeForCausalLM
    torch.manual_seed(0)
    model = JetMoeForCausalLM(JetMoeConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_key_value_heads=2,
        kv_channels=8, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2,
        use_cache=False)).train()
    with pytest.raises(monet_opt.CaptureError, match="takes no experts_implementation") as e:
        monet_opt.optimize(model, {"input_ids": torch.randint(3, 50, (2, 8))}, HUGE,
                           profile_repeats=1, profile_dir=None)
    assert 'build the model with experts_implementation' not in str(e.value)
