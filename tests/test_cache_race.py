"""Concurrent writers of the profile directory leave only whole, valid files (moved from
tests/test_cache.py)."""
from __future__ import annotations

import dataclasses
import json
import multiprocessing
import threading
import warnings

import torch

import monet_opt
import solvers
from monet_opt import cache
from monet_opt.api import profile_model
from monet_opt.cache import ProfileCache
from tests.test_cache import HUGE, _files, tiny


def test_atomic_writes_are_never_seen_half_done(tmp_path):
    path = tmp_path / "entry.json"
    payloads = [{"kind": "k", "data": [i] * 20000} for i in range(2)]
    stop, seen, errors = threading.Event(), set(), []

    def writer(data):
        while not stop.is_set():
            cache._write(path, data)

    def reader():
        for _ in range(200):
            try:
                seen.add(json.loads(path.read_text())["data"][0])
            except json.JSONDecodeError as exc:  # a half-written file: the failure
                errors.append(exc)
        stop.set()

    cache._write(path, payloads[0])

    threads = [threading.Thread(target=writer, args=(d,)) for d in payloads]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and seen <= {0, 1} and seen
    assert [p.name for p in tmp_path.iterdir()] == ["entry.json"]


def _race_worker(root: str, barrier) -> int:
    torch.set_num_threads(1)
    model, x = tiny()
    barrier.wait()
    # variants off: with them, store-all takes the variants its own profile times faster, so
    # two processes' plans (and peaks) could differ by the clock alone (seen once in CI)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=root, profile_repeats=1,
                             variants=False)
    return opt.plan.predicted_peak_bytes


def test_two_processes_share_one_directory(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Manager().Barrier(2)
    with ctx.Pool(2) as pool:
        jobs = [pool.apply_async(_race_worker, (str(tmp_path), barrier)) for _ in range(2)]
        peaks = [job.get(timeout=240) for job in jobs]
    assert peaks[0] == peaks[1]
    files = _files(tmp_path)
    assert [p.name for p in files if p.name.startswith(".")] == []  # no temporary files left
    assert sum(p.name == "profile.json" for p in files) == 1
    for path in files:  # every file whole and ours (a schedule made on the profile that lost
        # the race, if any, is valid but passed over)
        kind = cache.PROFILE_KIND if path.name == "profile.json" else cache.FLOOR_KIND \
            if path.name.startswith("least-peak-") else cache.SCHEDULE_KIND
        cache._load(path, kind)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        profile, = ProfileCache(tmp_path).profiles()
        assert len(ProfileCache(tmp_path).schedules(profile)) == 1


def test_a_lower_least_peak_written_meanwhile_is_kept(tmp_path):
    """Two callers sharing the directory: one that read the least-peak file before the other
    wrote a lower one overwrote it with its own higher least, so a call at the least peak the
    other reported was refused (cache probe). The file is read again before it is written."""
    model, x = tiny()
    profile, _ = profile_model(model, x, profile_dir=tmp_path, profile_repeats=1)
    store = ProfileCache(tmp_path)
    lower = []

    def meanwhile(problem, limit, solver, **kw):  # the other caller runs its whole solve here
        lower.append(store.solve(profile, 1, "milp", 5.0))
        got = solvers.solve(problem, limit, solver, **kw)
        store_all = solvers.solve(problem, 2**62, "store_all")
        return dataclasses.replace(got, min_feasible_bytes=store_all.peak_bytes,
                                   floor_schedule=store_all.schedule)

    store.solve(profile, 2, "milp", 5.0, solve=meanwhile)
    path, = tmp_path.glob("*/least-peak-milp*.json")
    assert json.loads(path.read_text())["peak_bytes"] == lower[0].min_feasible_bytes
    assert lower[0].min_feasible_bytes < solvers.solve(profile.problem, 2**62,
                                                       "store_all").peak_bytes
