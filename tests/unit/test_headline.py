"""The headline names a fastest setting only when its interval separates it from every other; otherwise
the settings tied within noise.  Like with like: one sequence length, one budget; an oversubscribed point
on a loaded machine never wins; the machine's load is stated with what it did to the intervals."""

from __future__ import annotations

from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.report import columns, headline
from ckptbench.store.records import SCHEMA_VERSION, to_frame
from ckptbench.store.repeats import single_records

MIB = 2**20


def rec(every_n: int, step: float, spread: float = 0.01, seq: int = 64, batch: int = 2, peak: float = 100 * MIB,
        load: str = "0.50 0.50 0.50", threads: int = 1, cpus: int = 2, n: int = 10) -> dict:
    """An ok record whose n step times lie within ±spread of `step` (so its interval is about that wide)."""
    case = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=batch, seq_len=seq, every_n_layers=every_n)
    times = [step * (1 + spread * (2 * i / (n - 1) - 1)) for i in range(n)]
    m = {"step_times_s": times, "step_time_median_s": sorted(times)[n // 2], "peak_bytes": peak, "threads": threads,
         "tokens_per_s": case.tokens_per_step / sorted(times)[n // 2]}
    return {"schema": SCHEMA_VERSION, "case_id": case.id, "suite": "unit", "case": case.to_dict(),
            "strategy": case.strategy, "status": "ok", "measurement": m,
            "env": {"load_average": load, "cpu_count": cpus}}


def table(records: list[dict], budgets=()) -> dict:
    t = columns.tidy(to_frame(single_records(records)))  # the loader's intervals, as a report reads them
    return {r["question"]: r for r in headline.headline(t, budgets)}


def test_separated_intervals_name_one_winner_with_its_interval_and_its_cost():
    rows = table([rec(0, 0.100), rec(2, 0.120), rec(1, 0.150, peak=50 * MIB)])
    fastest = rows["seq 64: fastest"]
    assert fastest["answer"] == "none"
    assert "97.85 % interval" in fastest["value"]  # 10 steps: x(2) .. x(9)
    assert fastest["against"] == "is no checkpointing"
    low = rows["seq 64: lowest peak memory"]
    assert low["answer"] == "full" and low["against"].startswith("50.0 % less peak memory, step time 1.50× [")


def test_overlapping_intervals_are_a_tie_not_a_winner():
    rows = table([rec(0, 0.100, spread=0.05), rec(2, 0.102, spread=0.05), rec(1, 0.150)])
    fastest = rows["seq 64: fastest"]
    assert fastest["answer"] == "tied within noise: none, every-2"  # full is separated: not in the tie
    assert fastest["value"].startswith("best median ")
    assert "every-2: 0.0 % less peak memory" in fastest["against"] and "step time 1.02×" in fastest["against"]


def test_different_sequence_lengths_are_never_compared():
    # every-2 at seq 128 is faster in tokens/s than anything at seq 64, yet each length has its own answer
    rows = table([rec(0, 0.100, seq=64), rec(2, 0.130, seq=64), rec(0, 0.300, seq=128), rec(2, 0.120, seq=128)])
    assert rows["seq 64: fastest"]["answer"] == "none"
    assert rows["seq 128: fastest"]["answer"] == "every-2"
    assert {q.split(":")[0] for q in rows} == {"seq 64", "seq 128"}


def test_a_budget_answers_among_the_points_that_fit_it():
    rows = table([rec(0, 0.100, peak=200 * MIB), rec(2, 0.120, peak=90 * MIB), rec(1, 0.150, peak=60 * MIB)],
                 budgets=(0.1, 0.01))
    assert rows["seq 64: fastest within 0.1 GiB"]["answer"] == "every-2"
    assert rows["seq 64: fastest within 0.1 GiB"]["against"].startswith("55.0 % less peak memory, step time 1.20×")
    assert rows["seq 64: fastest within 0.01 GiB"]["answer"] == "no measured point fits"


def test_few_steps_name_a_winner_only_with_the_coverage_they_have():
    rows = table([rec(0, 0.100, n=3), rec(1, 0.150, n=3)])
    fastest = rows["seq 64: fastest"]
    assert fastest["answer"] == "none; intervals of 75 %: too few steps for a 95 % call"
    assert "(75 % interval)" in fastest["value"]


def test_an_oversubscribed_point_on_a_loaded_machine_never_wins():
    # none ran 2 threads on 2 cores with a load average of 3.5: OpenMP's collapse; it is left out
    rows = table([rec(0, 0.080, threads=2, load="3.50 3.00 2.00"), rec(2, 0.120), rec(1, 0.150)])
    fastest = rows["seq 64: fastest"]
    assert fastest["answer"].startswith("every-2; left out, oversubscribed on a loaded machine: none")
    t = columns.tidy(to_frame(single_records([rec(0, 0.080, threads=2, load="3.50 3.00 2.00"), rec(2, 0.120),
                                              rec(1, 0.150, load="2.50 2.0 2.0")])))
    note = headline.load_note(t)
    assert (note["points"], note["loaded"], note["oversubscribed"]) == (3, 2, ["none · batch 2 · seq 64"])
    text = headline.load_text(note)
    assert text.startswith("The machine was loaded (load average above its 2 cores, up to 3.50) while 2 of 3")
    assert "never named fastest" in text


def test_a_calm_machine_is_said_to_be_calm_and_unknown_load_says_nothing():
    t = columns.tidy(to_frame(single_records([rec(0, 0.1), rec(1, 0.15)])))
    assert headline.load_text(headline.load_note(t)).startswith("The machine was not loaded")
    bare = [rec(0, 0.1)]
    bare[0]["env"] = {}
    assert headline.load_note(columns.tidy(to_frame(single_records(bare)))) is None


def test_fastest_on_bare_candidates():
    c = headline.Candidate
    a, b = c("a", 100.0, 95.0, 105.0, 0.96), c("b", 90.0, 80.0, 94.0, 0.96)
    assert headline.fastest([b, a]).kind == "winner" and headline.fastest([b, a]).best is a
    wide = c("c", 50.0, 40.0, 99.0, 0.75)  # far slower by its median, but its interval reaches a's
    answer = headline.fastest([a, b, wide])
    assert answer.kind == "tied" and [x.name for x in answer.tied] == ["a", "c"]
    assert headline.fastest([a]).kind == "only" and headline.fastest([]).kind == "none"
    assert headline.fastest([a, b], left_out=lambda x: x.name == "a").best is b


def test_no_checkpointing_under_a_setup_name_is_still_the_baseline():
    # a bf16-mixed run names its points "none+bf16-mixed", "full+bf16-mixed": the baseline is found all the same
    records = [rec(0, 0.100), rec(1, 0.150, peak=50 * MIB)]
    for r in records:
        r["strategy"] += "+bf16-mixed"
    rows = table(records)
    assert rows["seq 64: fastest"]["against"] == "is no checkpointing"
    assert rows["seq 64: lowest peak memory"]["against"].startswith("50.0 % less peak memory, step time 1.50× [")
