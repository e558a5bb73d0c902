"""Does optimize() hold its contract on models beyond the bench's? For each model, at small CPU
sizes with dropout and stochastic depth on: a store-all plan and a plan at half its activations
(or the least peak, if higher), then one step of each beside eager from the same random state.
Prints a markdown table (docs/benchmarks/coverage.md): the half plan's gradients against the
store-all plan's (bitwise?) and eager's (largest relative difference), its measured peak
against its prediction and its limit.

    python -m monet_opt.bench_coverage [--models convnext_tiny,hf_llama,...]
"""
from __future__ import annotations

import argparse
import copy
import sys
import time

import torch

import monet_opt
from monet_opt import bench_coverage_more, zoo
from monet_opt.bench_solvers import mib

TORCHVISION = {  # name: image size
    "efficientnet_b0": 64, "efficientnet_v2_s": 64, "convnext_tiny": 64, "mobilenet_v3_small": 64,
    "shufflenet_v2_x1_0": 64, "squeezenet1_0": 64, "regnet_y_400mf": 64, "mnasnet0_5": 64,
    "inception_v3": 96, "swin_t": 64, "vit_b_16": 64}
SEGMENTATION = {"lraspp_mobilenet_v3_large": 64, "fcn_resnet50": 64}  # bilinear upsampling
RECURRENT = ("gru", "lstm")
HF = ("hf_llama", "hf_llama_fused", "hf_t5", "hf_vit", "hf_qwen2", "hf_mistral", "hf_gemma",
      "hf_gpt_neox", "hf_bert_padded")
MORE_HF = ("hf_albert", "hf_bart", "hf_opt", "hf_bloom", "hf_falcon", "hf_distilbert",
           "hf_roberta", "hf_clip_vision", "hf_whisper",  # 4 layers (2 + 2) 128 wide, dropout 0.1
           "hf_gpt2_lora", "hf_gpt2_lora_checkpointed")
MORE = (*bench_coverage_more.DIFFUSION, *(f"timm_{n}" for n in bench_coverage_more.TIMM))


def build(name: str):
    """(model in train mode, sample input: a tensor or a dict of keyword arguments)."""
    torch.manual_seed(0)
    if name in TORCHVISION:
        import torchvision
        size = TORCHVISION[name]
        kwargs = {"num_classes": 10}
        if name == "inception_v3":
            kwargs.update(aux_logits=False, init_weights=False)
        if name == "vit_b_16":
            kwargs["image_size"] = size
        return getattr(torchvision.models, name)(**kwargs).train(), torch.randn(2, 3, size, size)
    if name in SEGMENTATION:
        import torchvision
        size = SEGMENTATION[name]
        model = getattr(torchvision.models.segmentation, name)(num_classes=4,
                                                              weights_backbone=None)
        return _Field("out", model).train(), torch.randn(2, 3, size, size)
    if name in RECURRENT:
        return _Tagger(getattr(torch.nn, name.upper())).train(), torch.randint(0, 1000, (4, 48))
    if name in MORE:
        return bench_coverage_more.build(name)
    import transformers as tf
    ids = torch.randint(0, 1000, (2, 64))
    if name in ("hf_llama", "hf_llama_fused"):
        # fused: no attention dropout (the fused kernel) and no cache, as training scripts set it;
        # traced, HF then builds a causal mask and repeats the keys and values (NOTE
        # [Grouped-query attention]); with a cache it passes is_causal and grouped keys
        fused = name == "hf_llama_fused"
        model = tf.LlamaForCausalLM(tf.LlamaConfig(
            vocab_size=1000, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.0 if fused else 0.1,
            use_cache=not fused))
        x = {"input_ids": ids}
    elif name == "hf_t5":
        model = tf.T5ForConditionalGeneration(tf.T5Config(
            vocab_size=1000, d_model=128, d_ff=256, num_layers=2, num_heads=4, d_kv=32))
        x = {"input_ids": ids, "decoder_input_ids": ids[:, :16]}
    elif name == "hf_vit":
        model = tf.ViTForImageClassification(tf.ViTConfig(
            hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=256,
            image_size=64, patch_size=8, hidden_dropout_prob=0.1))
        x = {"pixel_values": torch.randn(2, 3, 64, 64)}
    elif name == "hf_qwen2":  # grouped-query attention, no attention dropout: the fused kernel
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(
            vocab_size=1000, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2))
        x = {"input_ids": ids}
    elif name == "hf_mistral":  # a sliding window shorter than the input: not a causal mask
        model = tf.MistralForCausalLM(tf.MistralConfig(
            vocab_size=1000, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, sliding_window=16))
        x = {"input_ids": ids}
    elif name == "hf_gemma":  # one key/value head for four query heads
        model = tf.GemmaForCausalLM(tf.GemmaConfig(
            vocab_size=1000, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=1, head_dim=32))
        x = {"input_ids": ids}
    elif name == "hf_gpt_neox":
        model = tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(
            vocab_size=1000, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
            num_attention_heads=4, hidden_dropout=0.1))
        x = {"input_ids": ids}
    elif name in MORE_HF:
        return _more_hf(name, tf, ids)
    elif name == "hf_bert_padded":  # a padding mask read from an input's values
        model = tf.BertForMaskedLM(tf.BertConfig(
            vocab_size=1000, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
            intermediate_size=256))
        mask = torch.ones_like(ids)
        mask[0, 48:] = 0
        x = {"input_ids": ids, "attention_mask": mask}
    else:
        raise ValueError(f"unknown model {name!r}; choose from "
                         f"{[*TORCHVISION, *SEGMENTATION, *RECURRENT, *HF, *MORE_HF, *MORE]}")
    return zoo._LogitsOnly(model).train(), x


def _more_hf(name: str, tf, ids: torch.Tensor):
    """MORE_HF's models: ALBERT shares one layer's parameters among all four, BART and Whisper
    are encoder-decoders (Whisper's encoder convolves mel features), BLOOM adds ALiBi biases to
    its attention scores, GPT-2 with LoRA adapters trains only those."""
    wide = dict(vocab_size=1000, hidden_size=128, num_attention_heads=4)
    two = dict(vocab_size=1000, d_model=128, encoder_layers=2, decoder_layers=2,
               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=256,
               decoder_ffn_dim=256, dropout=0.1, attention_dropout=0.1)
    text = {"input_ids": ids}
    # the encoder-decoders' and LoRA's input: longer, so that activations outweigh gradients
    longer = torch.randint(0, 1000, (4, 128))
    if name == "hf_albert":
        model = tf.AlbertForMaskedLM(tf.AlbertConfig(
            embedding_size=64, num_hidden_layers=4, intermediate_size=256, **wide))
    elif name == "hf_bart":
        model = tf.BartForConditionalGeneration(tf.BartConfig(**two))
        text = {"input_ids": longer, "decoder_input_ids": longer[:, :64]}
    elif name == "hf_opt":
        model = tf.OPTForCausalLM(tf.OPTConfig(
            num_hidden_layers=4, ffn_dim=256, word_embed_proj_dim=128, dropout=0.1,
            attention_dropout=0.1, **wide))
    elif name == "hf_bloom":
        model = tf.BloomForCausalLM(tf.BloomConfig(
            vocab_size=1000, hidden_size=128, n_layer=4, n_head=4, hidden_dropout=0.1,
            attention_dropout=0.1))
    elif name == "hf_falcon":
        model = tf.FalconForCausalLM(tf.FalconConfig(
            num_hidden_layers=4, hidden_dropout=0.1, attention_dropout=0.1, **wide))
    elif name == "hf_distilbert":
        model = tf.DistilBertForMaskedLM(tf.DistilBertConfig(
            vocab_size=1000, dim=128, n_layers=4, n_heads=4, hidden_dim=256))
    elif name == "hf_roberta":  # position ids counted from the input's non-padding tokens
        model = tf.RobertaForMaskedLM(tf.RobertaConfig(
            num_hidden_layers=4, intermediate_size=256, **wide))
        text = {"input_ids": ids % 990 + 2}  # no padding token (1)
    elif name == "hf_clip_vision":
        model = tf.CLIPVisionModel(tf.CLIPVisionConfig(
            hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
            image_size=64, patch_size=8, attention_dropout=0.1))
        return _Field("last_hidden_state", model).train(), torch.randn(2, 3, 64, 64)
    elif name.startswith("hf_gpt2_lora"):  # LoRA fine-tuning (peft): adapters trained
        from peft import LoraConfig, get_peft_model
        gpt2 = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=4, n_embd=128, n_head=4, n_positions=128,
                                                vocab_size=1000, use_cache=False))
        if name.endswith("checkpointed"):  # NOTE [Reentrant checkpoints]
            gpt2.gradient_checkpointing_enable({"use_reentrant": True})
        model = get_peft_model(gpt2, LoraConfig(
            r=8, lora_alpha=16, lora_dropout=0.1, target_modules=["c_attn", "c_proj"],
            fan_in_fan_out=True))
        text = {"input_ids": longer}
    else:  # hf_whisper
        model = tf.WhisperForConditionalGeneration(tf.WhisperConfig(
            num_mel_bins=16, max_source_positions=128, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, decoder_start_token_id=1, **two))
        text = {"input_features": torch.randn(4, 16, 256), "decoder_input_ids": longer[:, :64]}
    return zoo._LogitsOnly(model).train(), text


class _Field(torch.nn.Module):
    """One entry of a model's dict output (torchvision's segmentation models return {"out"})."""

    def __init__(self, key: str, model: torch.nn.Module) -> None:
        super().__init__()
        self.key, self.model = key, model

    def forward(self, x):
        return self.model(x)[self.key]


class _Tagger(torch.nn.Module):
    """Embedding, a two-layer recurrent network (dropout between its layers), a linear head."""

    def __init__(self, rnn: type[torch.nn.RNNBase]) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(1000, 64)
        self.rnn = rnn(64, 64, num_layers=2, batch_first=True, dropout=0.2)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, ids):
        return self.head(self.rnn(self.embed(ids))[0])


def _call(module, x):
    if isinstance(x, dict):
        return module(**x)
    return module(*x) if isinstance(x, tuple) else module(x)


def _grads(module, owner: torch.nn.Module, x) -> list[torch.Tensor]:
    owner.zero_grad(set_to_none=True)
    torch.manual_seed(3)
    _call(module, x).square().sum().backward()
    return [p.grad.clone() for p in owner.parameters() if p.grad is not None]


def check(name: str) -> str:
    start = time.perf_counter()
    model, x = build(name)
    full = monet_opt.optimize(copy.deepcopy(model), x, 1 << 40, profile_dir=None)
    plan = full.plan
    limit = max(plan.min_feasible_bytes,
                plan.fixed_bytes + plan.gradient_bytes + plan.store_all_activation_bytes // 2)
    half = monet_opt.optimize(copy.deepcopy(model), x, limit, profile_dir=None, time_limit_s=10)
    eager = copy.deepcopy(model)
    g_eager, g_full = _grads(eager, eager, x), _grads(full, full.model, x)
    g_half = _grads(half, half.model, x)
    bitwise = all(torch.equal(a, b) for a, b in zip(g_full, g_half))
    diff = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()
               for a, b in zip(g_half, g_eager))
    half.model.zero_grad(set_to_none=True)
    peak = monet_opt.measure_peak(lambda: _call(half, x).sum().backward(),
                                  monet_opt.resident_tensors(half.model, x))
    predicted = half.plan.predicted_peak_bytes
    return (f"| {name} | {len(plan.rows)} | {mib(plan.store_all_activation_bytes)} | "
            f"{mib(limit)} | {mib(peak)} | {peak - predicted:+,d} | "
            f"{'yes' if peak <= limit else '**no**'} | {half.plan.recomputed_ops} | "
            f"{'yes' if bitwise else '**no**'} | {diff:.1e} | "
            f"{time.perf_counter() - start:.0f} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m monet_opt.bench_coverage")
    p.add_argument("--models", default=",".join([*TORCHVISION, *SEGMENTATION, *RECURRENT, *HF,
                                                 *MORE_HF, *MORE]))
    args = p.parse_args(argv)
    print(f"Command: `python -m monet_opt.bench_coverage {' '.join(argv or sys.argv[1:])}`, "
          f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads.\n")
    print("| model | ops | store-all activations MiB | limit MiB | measured peak MiB | "
          "measured - predicted B | within limit | recomputed runs | bitwise store-all | "
          "vs eager (max rel) | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        try:
            print(check(name), flush=True)
        except Exception as exc:  # noqa: BLE001 - a model that fails is a row of the report
            print(f"| {name} | failed: {type(exc).__name__}: {str(exc)[:200]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
