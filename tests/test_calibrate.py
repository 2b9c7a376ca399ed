"""Calibration: alpha-beta fits, the op-time table and the peaks measured on real Gloo workers, the disk
cache reused per machine and refused for another one, and spec-sheet presets that stay spec sheets."""

from __future__ import annotations

import json
import os
import statistics
import warnings

import pytest
import torch

from sbplab.compiler import SGD, compile, presets
from sbplab.hardware import CommFit, Hardware, op_key
from sbplab.models import MLP, MLPConfig
from sbplab.runtime import Accumulate, Compute, LocalCluster
from sbplab.runtime.calibrate import CalibrationCacheWarning, calibrate, calibrate_report, hardware_of
from sbplab.runtime.calibrate_comm import collective_plan, comm_axes, measured_kinds, p2p_plan
from sbplab.runtime.calibrate_fit import fit_alpha_beta
from sbplab.runtime.calibrate_trust import (
    MARGIN,
    REPEATABLE,
    CalibrationFitWarning,
    busy_message,
    noise_statement,
    reject_impossible,
)
from sbplab.runtime.calibration_cache import CalibrationRecord, age_text, cache_path, load, user_name
from sbplab.runtime.examples import data_parallel_linear
from sbplab.sim.predict import plan_of, simulate
from sbplab.sim.shapes import infer_rank_shapes

COLLECTIVES = measured_kinds()

# small sweeps keep a calibration well under a second of device work on 2 shared cores
SMALL = {"sizes": (1024, 16384), "repeats": 2, "matmul_n": 64, "copy_bytes": 1 << 20}
KINDS = {*COLLECTIVES, "send_recv"}


@pytest.fixture(autouse=True)
def _quiet_torch_deprecations():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.distributed renames, not ours
        yield


def _mlp_step(batch: int = 8):
    torch.manual_seed(0)
    m = MLP(MLPConfig(in_dim=8, width=8, hidden=16, n_blocks=1, n_classes=4))
    xs, y = m.example_batch(batch)
    return compile(m, xs, loss_fn=torch.nn.functional.cross_entropy, target=y, optimizer=SGD(lr=0.1),
                   strategy=presets.data_parallel(2))


def _compute_keys(step) -> set:
    """The op-table keys the simulator asks for: every Compute actor's (op, local shapes, dtype, device)."""
    plan, batch, _ = plan_of(step)
    keys = set()
    for r, rp in plan.ranks.items():
        shapes = infer_rank_shapes(rp.actors, r, plan.micro_batches, batch)
        for a in rp.actors:
            if isinstance(a, Compute):
                ins = shapes[a.name].inputs
                dtype = (ins or shapes[a.name].outputs)[0].dtype
                # a device-free step (a preset) is priced on the hardware's device: here the cpu it was calibrated on
                keys.add(op_key(a.op, [m.shape for m in ins], dtype, plan.device_type or "cpu"))
    return keys


# --- fits, settings and presets: no processes ------------------------------------------------------
def test_fit_recovers_a_known_alpha_and_bandwidth():
    alpha, bw, rounds = 40e-6, 2e9, 2
    points = [(b, alpha * rounds + b / bw) for b in (1024, 65536, 1 << 20, 1 << 24)]
    fit = fit_alpha_beta("all_reduce", 0, 3, rounds, points)
    assert fit == CommFit("all_reduce", 0, 3, pytest.approx(alpha, rel=1e-6), pytest.approx(bw, rel=1e-6),
                          pytest.approx(0.0, abs=1e-9))


def test_fit_reports_its_error_and_never_goes_negative():
    noisy = [(1024, 50e-6), (65536, 40e-6), (1 << 20, 600e-6), (1 << 22, 2.5e-3)]
    fit = fit_alpha_beta("all_gather", 1, 2, 1, noisy)
    assert fit.alpha >= 0 and fit.bandwidth > 0 and fit.rel_error > 0.01
    shrinking = [(1024, 900e-6), (1 << 20, 100e-6)]  # bigger took less: the per-byte slope stops at 0
    fit = fit_alpha_beta("broadcast", 0, 2, 1, shrinking)
    assert fit.alpha > 0 and fit.bandwidth > 1e12


@pytest.mark.parametrize("points,match", [([(1024, 1e-5)], "at least 2"),
                                          ([(1024, 0.0), (2048, 1e-5)], "seconds > 0")])
def test_fit_refuses_points_it_cannot_fit(points, match):
    with pytest.raises(ValueError, match=match):
        fit_alpha_beta("all_reduce", 0, 2, 2, points)


def test_axis_settings_a_cluster_can_form():
    assert comm_axes(1) == []
    assert [(s.axis, s.groups) for s in comm_axes(2)] == [(0, ((0, 1),))]
    four = [(s.axis, s.groups) for s in comm_axes(4)]
    assert four == [(0, ((0, 1, 2, 3),)), (0, ((0, 2), (1, 3))), (1, ((0, 1), (2, 3)))]  # world, 2x2 axes


@pytest.mark.parametrize("kind", COLLECTIVES)
def test_sweep_plans_are_valid_plans_on_a_2x2_mesh(kind):
    setting = comm_axes(4)[2]
    plan = collective_plan(kind, setting, (1024, 4096), 4, "cpu")  # building derives a deadlock-free order
    assert plan.groups() == [(0, 1), (2, 3)]
    assert [s.actor for s in plan.comm_order if s.rank == 0] == ["c0", "c1"]  # one size after another
    assert len(p2p_plan((1024, 4096), 2, "cpu").pairs()) == 1


def test_busy_plans_compute_beside_their_transfers():
    """The busy sweep's plans: every rank spins from tick to the step's end beside its collectives, and
    every pair of ranks ping-pongs with a compute burst before each reply and another after it."""
    plan = collective_plan("all_reduce", comm_axes(4)[0], (1024,), 4, "cpu", spins=5)
    for r in range(4):
        names = [a.name for a in plan.ranks[r].actors]
        assert [n for n in names if n.startswith("spin")] == [f"spin{j}" for j in range(5)]
        tock = next(a for a in plan.ranks[r].actors if a.name == "tock")
        assert [x.actor for x in tock.inputs] == ["tick", "spun"]  # the step waits for both chains
    games = p2p_plan((1024, 4096), 4, "cpu", burst_us=500.0)
    assert sorted(games.pairs()) == [(0, 1), (2, 3)]
    for responder in (1, 3):
        spin = next(a for a in games.ranks[responder].actors if a.name == "spin0")
        pong = next(a for a in games.ranks[responder].actors if a.name == "pong0")
        rest = next(a for a in games.ranks[responder].actors if a.name == "rest0")
        assert spin.attrs == rest.attrs == {"us": 500.0} and [x.actor for x in pong.inputs] == ["spin0"]
        assert [x.actor for x in rest.inputs] == ["spin0"]  # computes on while the reply leaves


@pytest.mark.parametrize("preset", [Hardware.h100_node(), Hardware.h100_ib(2), Hardware.a100_node()],
                         ids=["h100_node", "h100_ib", "a100_node"])
def test_presets_we_cannot_measure_keep_their_spec_sheet(preset):
    assert preset.origin == "spec sheet" and not preset.measured
    assert preset.op_times == () and preset.comm_fits == () and preset.firing_overhead == 0.0
    key = op_key("matmul", [(4096, 4096), (4096, 4096)], torch.bfloat16, "cuda")
    t, measured = preset.op_time(key, 2 * 4096**3, 3 * 4096**2 * 2, torch.bfloat16)
    assert not measured and t == pytest.approx(2 * 4096**3 / preset.flops_bf16)
    assert preset.alpha_beta("all_reduce", 0, 8) == (preset.axis_latency[0], preset.axis_bandwidth[0])


def test_a_record_becomes_a_hardware_with_measured_links_ops_and_peaks():
    key = op_key("relu", [(4, 16)], "float32", "cpu")
    fp = {"machines": [{"hostname": "box", "cpu_model": "cpu", "cores": 2}], "device_type": "cpu",
          "world_size": 2}
    rec = CalibrationRecord(fp, "2.0", comm_fits=[CommFit("all_reduce", 0, 2, 1e-4, 1e9, 0.1),
                                                  CommFit("send_recv", None, 2, 5e-5, 2e9, 0.1)],
                            firing_overhead=4e-6, peaks={"flops": 1e10, "mem_bandwidth": 5e9}, cores=2,
                            op_times={key: 7e-6})
    assert CalibrationRecord.from_json(json.loads(json.dumps(rec.to_json()))) == rec
    hw = hardware_of(rec, "cpu")
    assert hw.origin.startswith("measured on box") and hw.measured and hw.cores == 2
    assert (hw.axis_latency, hw.axis_bandwidth) == ((1e-4,), (1e9,))
    assert (hw.p2p_latency, hw.p2p_bandwidth) == (5e-5, 2e9)
    assert hw.op_time(key, 64, 512, torch.float32) == (7e-6, True)
    unseen = op_key("relu", [(8, 16)], "float32", "cpu")
    assert hw.op_time(unseen, 128, 1024, torch.float32) == (pytest.approx(1024 / 5e9), False)
    assert hash(hw) == hash(hardware_of(rec, "cpu"))


def test_a_link_faster_than_memory_is_rejected_and_capped():
    """A send/recv fit of 1,000,000 GB/s (what a busy machine gave) cannot be: capped at the copy bandwidth."""
    fits = [CommFit("send_recv", None, 2, 5e-5, 1e15, 0.3), CommFit("all_reduce", 0, 2, 1e-4, 2e9, 0.05)]
    kept, said = reject_impossible(fits, 1e10)
    assert kept[0].bandwidth == MARGIN * 1e10 and kept[0].alpha == 5e-5 and kept[1] == fits[1]
    assert len(said) == 1 and "send_recv (point to point) fitted 1e+06 GB/s" in said[0]
    assert "more than 2x the memory copy bandwidth" in said[0] and "Capped at 20 GB/s" in said[0]
    assert reject_impossible(fits, None) == (fits, [])  # no copy measured: nothing to judge by


def test_a_busy_machine_and_a_noisy_calibration_are_said():
    assert busy_message(1.5, 2) is None and busy_message(None, 2) is None
    said = busy_message(16.9, 2)
    assert "load average 16.9 on 2 cores" in said and "contention" in said
    assert "repeatable" in noise_statement(REPEATABLE / 2) and "noisy" in noise_statement(REPEATABLE * 3)


def test_the_cache_is_one_users_and_says_its_age(tmp_path):
    fp = {"machines": [{"hostname": "box", "cpu_model": "cpu", "cores": 2}], "device_type": "cpu",
          "world_size": 2}
    path = cache_path(tmp_path, fp)
    assert path.name == f"calibration-{user_name()}-box-cpu2.json" and user_name()
    rec = CalibrationRecord(fp, "2.0", measured_at=1_000.0, load=3.5)
    assert CalibrationRecord.from_json(json.loads(json.dumps(rec.to_json()))) == rec
    assert rec.age_s > 0 and "days old" in age_text(rec.age_s)
    assert age_text(90) == "2 min old" and age_text(None) == "age unknown"
    assert "at 1970-01-01 00:16 UTC" in hardware_of(rec, "cpu").origin


# --- on real workers ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(2) as c:
        yield c


@pytest.mark.multiprocess
def test_calibration_of_a_compiled_dp_step(cluster, tmp_path):
    step = _mlp_step()
    rep = calibrate_report(cluster, step, cache_dir=tmp_path, **SMALL)
    hw = rep.hardware
    assert rep.path is not None and rep.path.exists() and not rep.reused and not rep.skipped
    assert rep.measured.comm and rep.measured.overhead and rep.measured.peaks and rep.measured.ops > 0
    assert {f.kind for f in hw.comm_fits} == KINDS
    for f in hw.comm_fits:
        assert f.alpha >= 0 and f.bandwidth > 0 and 0 <= f.rel_error < float("inf"), f
        assert f.group_size == 2 and f.axis == (None if f.kind == "send_recv" else 0)
    assert hw.firing_overhead > 0 and hw.cores == os.cpu_count()
    ar, p2p = hw.comm_fit("all_reduce", 0, 2), hw.comm_fit("send_recv", None, 2)
    assert (ar.busy_alpha is not None) == (2 >= hw.cores)  # two ranks computing fill two cores
    assert (p2p.busy_alpha is not None) == (1 >= hw.cores)  # one pair: one burst at a time
    assert hw.origin.startswith("measured on") and hw.measured
    assert hw.flops != Hardware.cpu_box().flops and hw.mem_bandwidth != Hardware.cpu_box().mem_bandwidth
    table = dict(hw.op_times)
    keys = _compute_keys(step)
    assert keys and keys <= set(table)  # every compute op instance of the step was profiled
    for key in keys:
        t, measured = hw.op_time(key, 1.0, 1.0, torch.float32)
        assert measured and t == table[key] > 0
    op, shapes, dtype, dev = next(k for k in sorted(keys) if k[1] and k[1][0])  # a key with a batch dim
    unseen = (op, tuple((s[0] * 1000,) + s[1:] if s else s for s in shapes), dtype, dev)
    t, measured = hw.op_time(unseen, 1e9, 1e6, torch.float32)
    assert not measured and t == pytest.approx(max(1e9 / hw.flops, 1e6 / hw.mem_bandwidth))
    assert simulate(step, hw).measured_fraction == 1.0  # the simulator finds every kernel in the table
    assert simulate(step, Hardware.cpu_box()).measured_fraction == 0.0


@pytest.mark.multiprocess
def test_a_calibration_says_its_load_age_noise_and_shows_progress(cluster, tmp_path, capsys):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        rep = calibrate_report(cluster, None, cache_dir=tmp_path, progress=True, **SMALL)
    assert "calibrate" in capsys.readouterr().err  # the bar, in a terminal
    assert rep.age_s is not None and rep.age_s >= 0 and rep.load is not None
    assert rep.noise == max(f.rel_error for f in rep.hardware.comm_fits)
    assert rep.repeatability == noise_statement(rep.noise) and rep.repeatability in rep.summary()
    copy = max(rep.hardware.mem_bandwidth, Hardware.cpu_box().mem_bandwidth)
    assert all(f.bandwidth <= MARGIN * copy for f in rep.hardware.comm_fits)  # nothing faster than memory
    fit_warnings = [w for w in seen if issubclass(w.category, CalibrationFitWarning)]
    assert len(fit_warnings) == len(rep.rejected)
    later = calibrate_report(cluster, None, cache_dir=tmp_path, progress=False, **SMALL)
    assert later.reused and later.age_s >= rep.age_s and "old" in later.summary()


@pytest.mark.multiprocess
def test_the_cache_is_reused_and_extended(cluster, tmp_path):
    step = _mlp_step()
    first = calibrate_report(cluster, step, cache_dir=tmp_path, **SMALL)
    again = calibrate_report(cluster, step, cache_dir=tmp_path, **SMALL)
    assert again.reused and not again.measured.anything and again.stale is None
    assert again.hardware == first.hardware
    bigger = _mlp_step(batch=16)  # the same ops on new local shapes: only those are profiled
    new_keys = _compute_keys(bigger) - set(dict(first.hardware.op_times))
    grown = calibrate_report(cluster, bigger, cache_dir=tmp_path, **SMALL)
    assert grown.reused and not grown.measured.comm and grown.measured.ops == len(new_keys) > 0
    assert set(dict(first.hardware.op_times)) | new_keys == set(dict(grown.hardware.op_times))
    assert cluster.calibrate(bigger, cache_dir=tmp_path, **SMALL) == grown.hardware  # the cluster's method


@pytest.mark.multiprocess
@pytest.mark.parametrize("field,value,why", [("cpu_model", "Foreign CPU 9000", "another machine"),
                                             ("torch", "0.0.1", "torch 0.0.1")])
def test_a_foreign_cache_file_is_measured_again(cluster, tmp_path, field, value, why):
    path = calibrate_report(cluster, None, cache_dir=tmp_path, **SMALL).path
    doc = json.loads(path.read_text())
    if field == "torch":
        doc["torch"] = value
    else:
        doc["fingerprint"]["machines"][0][field] = value
    doc["firing_overhead"] = 123.0  # a figure that must not leak into this machine's Hardware
    path.write_text(json.dumps(doc))
    with pytest.warns(CalibrationCacheWarning, match=why):
        rep = calibrate_report(cluster, None, cache_dir=tmp_path, **SMALL)
    assert not rep.reused and why in rep.stale and rep.measured.comm and rep.measured.overhead
    assert rep.hardware.firing_overhead < 1.0
    fixed = json.loads(path.read_text())
    assert fixed["firing_overhead"] < 1.0
    assert fixed["fingerprint"]["machines"][0]["cpu_model"] != "Foreign CPU 9000"
    assert load(path, fixed["fingerprint"], fixed["torch"])[0] is not None


@pytest.mark.multiprocess
def test_a_hand_built_plan_with_sources_and_accumulation(cluster, tmp_path):
    plan = data_parallel_linear(2, torch.randn(8, 4), lr=0.1, batch=8, micro_batches=2)
    feeds = {"x": torch.randn(8, 8), "t": torch.randn(8, 4)}
    hw = calibrate(cluster, plan, cache=False, feeds=feeds, **SMALL)
    assert list(tmp_path.iterdir()) == []  # cache=False writes nothing
    ops = {k[0] for k, _ in hw.op_times}
    assert {a.op for a in plan.ranks[0].actors if isinstance(a, Compute)} <= ops
    assert {a.label for a in plan.ranks[0].actors if isinstance(a, Accumulate)} <= ops
    assert simulate(plan, hw, feeds=feeds).measured_fraction == 1.0


@pytest.mark.multiprocess
def test_bad_arguments_say_what_is_valid(cluster):
    with pytest.raises(ValueError, match="at least 2 distinct"):
        calibrate(cluster, None, sizes=(1024,), cache=False)
    with pytest.raises(ValueError, match="repeats must be an int >= 1"):
        calibrate(cluster, None, repeats=0, cache=False)
    with pytest.raises(TypeError, match="needs a LocalCluster"):
        calibrate(object())


@pytest.mark.multiprocess
def test_four_ranks_measure_the_world_and_both_axes_of_a_2x2_mesh():
    with LocalCluster(4) as four:
        hw = four.calibrate(None, cache=False, **SMALL)
    settings = {(f.kind, f.axis, f.group_size) for f in hw.comm_fits}
    axes = ((0, 4), (0, 2), (1, 2))  # (mesh axis, group size): the world, then the 2x2 mesh's axes
    assert settings == {(k, a, p) for k in COLLECTIVES for a, p in axes} | {("send_recv", None, 2)}
    assert all(f.alpha >= 0 and f.bandwidth > 0 for f in hw.comm_fits)
    # with every core computing a transfer waits at least as long per round; measured only where 4 ranks
    # can fill the cores (all ranks computing for collectives, one rank of each pair for send/recv)
    for (kind, axis, p), fills in [(("all_reduce", 0, 4), 4 >= hw.cores), (("send_recv", None, 2), 2 >= hw.cores)]:
        f = hw.comm_fit(kind, axis, p)
        assert (f.busy_alpha is not None) == fills, f
        assert f.busy_alpha is None or f.busy_alpha >= f.alpha
        busy = hw.alpha_beta(kind, axis, p, busy=True)
        assert busy == ((f.busy_alpha if fills else f.alpha), f.bandwidth)
    assert hw.alpha_beta("all_gather", 1, 2) == (hw.comm_fit("all_gather", 1, 2).alpha,
                                                 hw.comm_fit("all_gather", 1, 2).bandwidth)
    # the links: per axis the median over the kinds measured on its largest group
    assert hw.axis_bandwidth == tuple(statistics.median(hw.comm_fit(k, a, p).bandwidth for k in COLLECTIVES)
                                      for a, p in ((0, 4), (1, 2)))
