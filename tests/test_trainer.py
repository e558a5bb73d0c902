"""HF's Trainer drives the optimized module as it drives the model (NOTE [The model's signature]
and NOTE [New input shapes] in monet_opt/module.py): it keeps the batch columns the model's
forward names, passes num_items_in_batch, and trains bitwise like the plain model."""
from __future__ import annotations

import copy
import inspect
import warnings

import pytest
import torch

import monet_opt
from tests import models
from tests.test_executor import HUGE

pytest.importorskip("accelerate")


class Tokens(torch.utils.data.Dataset):
    def __init__(self, seq: int, n: int = 6) -> None:
        self.seq, self.n = seq, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(3, 500, (self.seq,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


def _train(model, batch: int, seq: int, out) -> None:
    from transformers import Trainer, TrainingArguments
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=batch,
                             num_train_epochs=1, report_to=[], use_cpu=True, seed=0,
                             save_strategy="no", dataloader_drop_last=True,
                             disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=Tokens(seq)).train()


def test_trainer_trains_the_optimized_module_as_the_model(tmp_path):
    torch.manual_seed(0)
    base, x, _ = models.gpt2_tiny(dropout=0.1)
    ids = x["input_ids"]
    eager = copy.deepcopy(base)
    opt = monet_opt.optimize(base, {"input_ids": ids, "labels": ids.clone()}, HUGE,
                             profile_repeats=1, profile_dir=None, time_limit_s=2)
    assert inspect.signature(opt.forward) == inspect.signature(base.forward)
    assert "labels" in inspect.signature(type(opt).forward).parameters
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _train(opt, *ids.shape, tmp_path / "ours")
    replanned = [str(w.message) for w in seen if issubclass(w.category, monet_opt.ReplanWarning)]
    assert len(replanned) == 1 and "num_items_in_batch" in replanned[0], replanned
    _train(eager, *ids.shape, tmp_path / "eager")
    for (name, p), q in zip(base.named_parameters(), eager.parameters()):
        assert torch.equal(p, q), name
    assert isinstance(copy.deepcopy(opt), monet_opt.OptimizedModule)


def test_label_smoothing_shifts_the_labels_as_for_the_model(tmp_path):
    """NOTE [Named as the model] (monet_opt/forwarded.py): Trainer shifts a causal LM's labels
    by the unwrapped model's _get_name(), which said "OptimizedModule": the smoothed loss was
    of each token predicting itself."""
    from transformers import Trainer, TrainingArguments
    torch.manual_seed(0)
    base, x, _ = models.gpt2_tiny(dropout=0.0)
    batch = {"input_ids": x["input_ids"], "labels": x["input_ids"].clone()}
    opt = monet_opt.optimize(base, batch, HUGE, profile_repeats=1, profile_dir=None)
    args = TrainingArguments(output_dir=str(tmp_path), label_smoothing_factor=0.1,
                             use_cpu=True, report_to=[])
    ours, eager = (Trainer(model=m, args=args).compute_loss(m, dict(batch)) for m in (opt, base))
    assert torch.equal(ours, eager)
    assert repr(opt).startswith("OptimizedModule(") and opt._get_name() == base._get_name()


def test_a_step_after_save_pretrained_is_the_same_step(tmp_path):
    """NOTE [Values saving sets] (monet_opt/attributes.py): save_pretrained, which Trainer
    calls at every checkpoint, set config.architectures to a list: the next step raised
    TypeError (unhashable list), and config.dtype planned it again."""
    torch.manual_seed(0)
    base, x, _ = models.gpt2_tiny(dropout=0.0)
    batch = {"input_ids": x["input_ids"], "labels": x["input_ids"].clone()}
    opt = monet_opt.optimize(base, batch, HUGE, profile_repeats=1, profile_dir=None)
    opt(**batch).loss.backward()
    base.save_pretrained(tmp_path)
    base.zero_grad(set_to_none=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", monet_opt.ReplanWarning)
        opt(**batch).loss.backward()
        base.config = type(base.config).from_pretrained(tmp_path)  # transformers_version set
        base.zero_grad(set_to_none=True)
        opt(**batch).loss.backward()
    assert base.config.architectures == [type(base).__name__] and len(opt.plans) == 1
