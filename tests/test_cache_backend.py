"""A profile measured under other backend settings (oneDNN off, deterministic algorithms) is
not served: those settings pick other kernels, with other times and scratch memory.
NOTE [Backend settings in the key] in monet_opt/cache_keys.py."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from monet_opt.cache_keys import device_name
from tests.test_cache import HUGE, _optimize, calls, tiny  # noqa: F401 (calls: a fixture)


def test_a_profile_is_served_only_under_the_settings_it_was_measured_with(calls, tmp_path):
    model, x = tiny()
    _optimize(model, x, HUGE, profile_dir=tmp_path)
    assert calls.take() == (1, 1)
    with torch.backends.mkldnn.flags(enabled=False):
        _optimize(model, x, HUGE, profile_dir=tmp_path)
        assert calls.take() == (1, 1)
        _optimize(model, x, HUGE, profile_dir=tmp_path)
        assert calls.take() == (0, 0)
    _optimize(model, x, HUGE, profile_dir=tmp_path)  # back at the defaults: the first profile
    assert calls.take() == (0, 0)
    devices = sorted(json.loads(p.read_text())["key"]["device"]
                     for p in Path(tmp_path).glob("*/profile.json"))
    assert len(devices) == 2 and devices[1] == devices[0] + ", oneDNN off"


def test_settings_at_their_defaults_leave_the_device_name_as_it_was():
    x = [torch.zeros(1)]
    plain = device_name(x)
    assert plain.startswith("cpu: ") and plain.endswith(f"{torch.get_num_threads()} threads")
    torch.use_deterministic_algorithms(True)
    try:
        assert device_name(x) == plain + ", deterministic algorithms"
    finally:
        torch.use_deterministic_algorithms(False)
    assert device_name(x) == plain
