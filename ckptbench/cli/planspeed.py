"""``plan``'s speed inputs from the flags: the link its ranks' collectives cross and who times its steps."""

from __future__ import annotations

import os
import sys

from ..base.errors import UsageError


def network_of(args, cal: dict, sources: dict):
    """The link the plan's collectives cross (a measured one from the calibration, or None: the named
    links), refusing a world that does not split into hosts or a link that cannot join them; says in
    `sources` what is assumed."""
    from ..theory.comm.network import link_named, measured_link
    from ..theory.policy.plan import Assumptions
    from ..theory.time.planspeed import ring_link

    n, per = args.world, args.ranks_per_host or 8
    net = link_named(args.network)
    if n > per:
        if n % per:
            raise UsageError(f"--world {n}: not a multiple of --ranks-per-host {per} (hosts of equal size)")
        if not net.between_hosts:
            raise UsageError(f"--network {args.network}: links GPUs inside one host, and --world {n} spans "
                             f"{n // per} hosts of {per}: name the network between them (e.g. --network '400G IB')")
        if link_named(args.intra_host).between_hosts:
            raise UsageError(f"--intra-host {args.intra_host}: a network between hosts, not a link inside one "
                             "(NVLink, NVLink3, PCIe 4, PCIe 5)")
    measured = None
    if cal.get("collective_bus_bytes_per_s"):
        measured = measured_link(net, cal["collective_bus_bytes_per_s"], cal.get("collective_latency_s"),
                                 f"calibration {args.calibration}")
    hosts = f"{n // per} hosts of {per} on {args.network}, {args.intra_host} inside" if n > per else args.network
    link = ring_link(Assumptions(1, "cuda", world=n, network=args.network, ranks_per_host=per,
                                 intra=args.intra_host, measured_link=measured))
    how = ("FSDP2: each layer all-gathered twice and reduce-scattered once a micro-batch, prefetched under the "
           "neighbouring layers' compute" if args.sharding == "fsdp" else
           f"local SGD every {args.local_sgd_steps} steps, waited for" if args.local_sgd_steps else
           "DDP: 25 MiB gradient buckets all-reduced during the backward")
    sources["network"] = (f"{n} ranks, {how}; ring on {hosts} at {link.bus_Bps / 1e9:.3g} GB/s bus bandwidth "
                          f"({'measured' if measured else 'nominal x assumed efficiency'}), {link.latency_s * 1e6:.0f} us "
                          "a hop")
    return measured


def step_timer(args, a, threads: int):
    """Who times the plan's steps: baseline steps measured here and transformed (this CPU, or the card itself
    when the plan runs on it: :class:`~ckptbench.run.baselines.MeasuredTimer`), else the traced step at the
    rates a measured card's kernels reached (:class:`~ckptbench.theory.time.achieved.AchievedTimer`: the committed
    H200 run, or --from-run's CUDA records), or with --lower-bound the card's datasheet roofline
    (:class:`~ckptbench.theory.time.plantime.DatasheetTimer`)."""
    from ..run.baselines import MeasuredTimer
    from ..theory.time.achieved import AchievedTimer
    from ..theory.time.plantime import DatasheetTimer

    if a.device == "cpu":
        return MeasuredTimer(args.rates_dir, threads)
    import torch

    if torch.cuda.is_available() and a.device_name.lower() in torch.cuda.get_device_name().lower():
        return MeasuredTimer(args.rates_dir, threads, a.link_bytes_per_s)
    if args.lower_bound:
        return DatasheetTimer(a.device_name, a.link_bytes_per_s, a.peak_flops_per_s)
    fit = run_fit(args.from_run) if args.from_run else None
    if args.from_run and fit is None:
        print(f"warning: {args.from_run}: fewer than two shapes of ok single-rank CUDA steps: the step times use "
              "the committed H200 run's fractions", file=sys.stderr)
    if fit is not None:
        fitted = fit[0]
    else:
        from ..theory.time.achieved_fit import H200 as fitted
    return AchievedTimer(a.device_name, fitted, a.link_bytes_per_s)


def run_fit(run_dir: str):
    """The achieved fractions of a CUDA run's single-rank records (at least two shapes) and a row per point
    (:func:`~ckptbench.theory.time.achieved.achieved_from`), or None."""
    from ..run.calibration import read_calibration
    from ..store.records import load_records
    from ..store.schema import typed
    from ..theory.time.achieved import achieved_from

    records = [r for r in typed(load_records(run_dir).records) if r.ok and r.case.device == "cuda"
               and r.case.world_size == 1 and r.measurement.step_time_median_s]
    cal = read_calibration(os.path.join(run_dir, "calibration.json"), False) \
        if os.path.exists(os.path.join(run_dir, "calibration.json")) else {}
    name = cal.get("device_name") or (records[0].env.get("device_name") if records else None)
    cases = [r.case for r in records]
    if not name or len({(c.batch_size, c.seq_len) for c in cases}) < 2:
        return None
    from ..run.calibration import calibrated_link

    return achieved_from(cases, [r.measurement.step_time_median_s for r in records], name,
                         calibrated_link(cal), run_dir)
