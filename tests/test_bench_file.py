"""bench.json as `monet-opt bench` reads and writes it (monet_opt/bench/results.py)."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest

from monet_opt.bench import results
from tests.test_bench import _other_run


@pytest.mark.parametrize("content", ["[1, 2]", json.dumps(
    {"schema_version": results.SCHEMA_VERSION, "models": {"x": {"meta": {"model": "x"},
                                                                "points": []}}}), None],
    ids=["a list", "a truncated run", "a folder"])
def test_a_file_not_the_benchmarks_is_refused_saying_what_to_do(tmp_path, content):
    """Each came out as a bare AttributeError, TypeError or IsADirectoryError."""
    path = tmp_path / results.JSON_NAME
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    with pytest.raises(results.BenchFileError, match="move it away or pass --no-merge"):
        results.load(path)


def test_a_save_keeps_what_another_run_saved_since(tmp_path):
    """Two runs into one folder each wrote the runs they had read at their start: the first to
    finish was lost. A save merges into the file as it is then (but under --no-merge)."""
    path = tmp_path / results.JSON_NAME
    first = _other_run()
    second = dataclasses.replace(first, meta=dataclasses.replace(first.meta, model="second"))
    results.save(path, {"other": first})
    results.save(path, {"second": second})
    assert set(results.load(path)) == {"other", "second"}
    results.save(path, {"second": second}, merge=False)
    assert set(results.load(path)) == {"second"}


def test_the_file_is_as_readable_as_the_reports(tmp_path):
    """mkstemp's 0600 was kept by the rename, where bench.md and the plots are 0644."""
    path = tmp_path / results.JSON_NAME
    results.save(path, {"other": _other_run()})
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
