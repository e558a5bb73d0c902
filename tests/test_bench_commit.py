"""A bench run names the commit its code ran at; what runs write (docs/, markdown) does not mark
it "with uncommitted changes", a changed code file does."""
from __future__ import annotations

import subprocess

from monet_opt.bench.settings import git_commit


def _git(root, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root,
                   check=True, capture_output=True)


def test_the_bench_output_does_not_mark_the_commit_dirty(tmp_path):
    (tmp_path / "docs" / "benchmarks").mkdir(parents=True)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "docs" / "benchmarks" / "bench.json").write_text("{}")
    (tmp_path / "README.md").write_text("numbers")
    (tmp_path / "pkg" / "code.py").write_text("x = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "first")
    head = git_commit(tmp_path)
    assert len(head) == 12 and "uncommitted" not in head
    (tmp_path / "docs" / "benchmarks" / "bench.json").write_text('{"models": {}}')
    (tmp_path / "README.md").write_text("new numbers")
    (tmp_path / "pkg" / "notes.txt").write_text("untracked")
    assert git_commit(tmp_path) == head, "a model's output, written mid-run, is not code"
    (tmp_path / "pkg" / "code.py").write_text("x = 2\n")
    assert git_commit(tmp_path) == head + " (with uncommitted changes)"


def test_outside_a_checkout_it_says_so(tmp_path):
    assert git_commit(tmp_path / "nowhere") == "unknown (not a git checkout)"
