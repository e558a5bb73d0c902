"""Each test runs in its own empty working directory, so optimize()'s default profile
directory ("profiles", relative) starts empty and never lands in the checkout."""
import pytest


@pytest.fixture(autouse=True)
def _own_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
