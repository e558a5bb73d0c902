"""An HF causal LM trained the usual way, `opt(**batch, labels=y).loss.backward()`: its step
returns the loss and the logits, and the loss's backward hands the logits no gradient (NOTE
[Outputs beside the loss] in monet_opt/unseeded.py). For a Llama of vocabulary 32,000 (b2, 64
tokens, random init): eager's measured peak, the least peak our solver reaches for the model
and for a module returning its loss alone, and a step at a limit between them, measured
(allocation events) against its prediction, gradients against eager's.

    .venv/bin/python docs/benchmarks/outputs_beside_loss.py
"""
import copy
import tempfile

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

import monet_opt

MIB = 1 << 20


class LossOnly(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **batch) -> torch.Tensor:
        return self.model(**batch).loss


def least(module: nn.Module, batch: dict) -> int:
    try:
        monet_opt.optimize(module, batch, 1, profile_dir=tempfile.mkdtemp(), time_limit_s=10)
    except monet_opt.InfeasibleBudgetError as err:
        return err.min_feasible_bytes
    raise AssertionError("1 byte fitted")


torch.set_num_threads(2)
torch.manual_seed(0)
config = LlamaConfig(vocab_size=32000, hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     tie_word_embeddings=False, attn_implementation="eager", use_cache=False)
model = LlamaForCausalLM(config).train()
eager = copy.deepcopy(model)
ids = torch.randint(0, 32000, (2, 64), generator=torch.Generator().manual_seed(1))
batch = {"input_ids": ids, "labels": ids.clone()}
eager_peak = monet_opt.measure_peak(lambda: eager(**batch).loss.backward(),
                                    monet_opt.resident_tensors(eager, batch))
ours, alone = least(model, batch), least(LossOnly(copy.deepcopy(model)), batch)
print(f"eager's peak {eager_peak / MIB:.2f} MiB; least peak: the model {ours / MIB:.2f} MiB, "
      f"its loss alone {alone / MIB:.2f} MiB")
limit = 55 * MIB  # between the two least peaks the model had before
try:
    opt = monet_opt.optimize(model, batch, limit, profile_dir=tempfile.mkdtemp(), time_limit_s=10)
except monet_opt.InfeasibleBudgetError:
    print(f"at {limit / MIB:.2f} MiB: refused")
else:
    model.zero_grad(set_to_none=True)
    measured = monet_opt.measure_peak(lambda: opt(**batch).loss.backward(),
                                      monet_opt.resident_tensors(model, batch))
    eager.zero_grad(set_to_none=True)
    eager(**batch).loss.backward()
    same = all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                             eager.parameters()))
    print(f"at {limit / MIB:.2f} MiB: measured {measured:,} B, predicted "
          f"{opt.plan.predicted_peak_bytes:,} B, gradients bitwise eager's: {same}")
