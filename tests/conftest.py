"""Each test runs in its own empty working directory, so optimize()'s default profile
directory ("profiles", relative) starts empty and never lands in the checkout.

Under CI (CI=true), Hypothesis draws the same examples every run: a red CI then means a change
broke something, not that a new random example was drawn. Local runs keep exploring."""
import importlib
import os

import pytest
from hypothesis import settings

# xdist's controller imports a warning's module to show it: importing monet_opt.step there
# failed on monet_opt.plan half made (a circular ImportError that took both workers down,
# where a plain `import monet_opt.step` does not); loaded here, it is whole before any test
importlib.import_module("monet_opt")

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _own_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
