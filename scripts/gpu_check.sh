#!/usr/bin/env bash
# gpu-check: the GPU path end to end on one CUDA device, within BUDGET_S seconds (default 480: 8 minutes).
#
#   bash scripts/gpu_check.sh OUTDIR          (make gpu-check OUT=OUTDIR)
#
# Runs with the machine's own python3 and packages: no virtual environment, no network.  When .whl/ holds
# wheels (docs/gpu.md), they are installed into /tmp/site first and put ahead on PYTHONPATH.
#
# Parts, most important first; each is time-boxed, none starts without the time it needs, and one that
# fails or runs out of its box does not stop the next (docs/gpu.md has the budget of each):
#   sweep       SUITE (default suites/gpu-check.toml) into OUTDIR/run, then
#               scripts/step_time_accuracy.py --from-run OUTDIR/run into OUTDIR/step_time_accuracy.txt
#   extras      EXTRAS_SUITE (default suites/gpu-extras.toml: streamed offload, torch.compile budgets,
#               LoRA r=16) into OUTDIR/extras
#   plan        ckptbench plan PLAN_ARGS --optimize --verify (default --model llama-1b --device <this card>
#               --seq 4096 --memory 60GiB): the optimum, the best ranked and the best every-n strategy
#               measured, into OUTDIR/plan.txt and OUTDIR/plan/
#   gpu-tests   pytest -m gpu on the test files that hold gpu tests, into OUTDIR/pytest-gpu.log
# before them the environment check and calibration, after them (in the FINAL_S seconds kept for it) the
# simulated predictions, the reports, the GPU summaries, the worker logs packed, and a table of each
# part's time.
#
# Environment: PYTHON (default python3); BUDGET_S (default 480); PARTS (default all four above; only
# "sweep" when SUITE is given, so SUITE=... alone sweeps that suite with the whole budget, as make bench
# does on CUDA); SUITE, EXTRAS_SUITE, PLAN_ARGS (above); MAX_MINUTES (no main-sweep point starts later;
# default 6 when the sweep is the only part; never after the sweep's box allows); SWEEP_BOX_S, STA_BOX_S, EXTRAS_BOX_S, PLAN_BOX_S,
# TESTS_BOX_S, FINAL_S (the boxes, in seconds: 200, 30, 120, 150, 60, 40); SIMULATED (a simulated.jsonl
# made beforehand with `ckptbench simulate-suite`; default for the GPU suites:
# results/reference-gpu-small-sim/simulated.jsonl, whose case ids are theirs; missing points are
# simulated here if time is left).  ALLOW_CPU=1: run on a machine without CUDA, to test this script
# itself; the defaults then become CPU stand-ins (suites/gpu-check-cpu.toml, suites/gpu-extras-cpu.toml,
# plan --optimize --model llama-tiny --device cpu), so every part runs in seconds.
#
# OUTDIR receives: gpu_check.log (everything printed here), run/ (records.jsonl, timelines.jsonl,
# calibration.jsonl, suite.toml, calibration.json, simulated.jsonl, summary.json), report.html,
# report.checks.csv, step_time_accuracy.txt, achieved_fit.py and .txt (the card's achieved fractions), extras/ (the same files as run/ but calibration.json and
# simulated.jsonl, and its report.html, report.checks.csv), plan.txt, plan/ (the verify sweep's files,
# optimum.json, optimum.toml, policy.py and the plan's baseline steps), pytest-gpu.log, logs.tar.gz
# (every folder the sweeps kept in their results directories: per-point worker logs, ...), nothing
# deeper than OUTDIR/*/.
set -uo pipefail

OUTDIR=${1:?usage: scripts/gpu_check.sh OUTDIR}
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-480}
SWEEP_BOX_S=${SWEEP_BOX_S:-200}
STA_BOX_S=${STA_BOX_S:-30}
EXTRAS_BOX_S=${EXTRAS_BOX_S:-120}
PLAN_BOX_S=${PLAN_BOX_S:-150}
TESTS_BOX_S=${TESTS_BOX_S:-60}
FINAL_S=${FINAL_S:-40}
SUITE_GIVEN=${SUITE:+1}
if [ -n "${PARTS:-}" ]; then PARTS=" ${PARTS//,/ } "
elif [ -n "$SUITE_GIVEN" ]; then PARTS=" sweep "
else PARTS=" sweep extras plan gpu-tests "
fi
cd "$(dirname "$0")/.."
REPO=$PWD
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
RUN="$OUTDIR/run"
EXTRAS="$OUTDIR/extras"
PLAN="$OUTDIR/plan"
export PYTHONUNBUFFERED=1
# torch.cuda.is_available() through NVML: the fork server must never initialise CUDA before forking.
export PYTORCH_NVML_BASED_CUDA_CHECK=1
step() { echo; echo "== [$(date +%H:%M:%S) +${SECONDS}s] $*"; }
left() { echo $(( BUDGET_S - SECONDS )); }
min() { if [ "$1" -lt "$2" ]; then echo "$1"; else echo "$2"; fi; }
# timed S CMD...: CMD ends within S seconds (SIGINT at S - 10, SIGKILL at S); its exit status, 124 when
# it was stopped
timed() { local s=$1; shift; [ "$s" -gt 12 ] || s=12; timeout -s INT -k 10 $(( s - 10 )) "$@"; }

TABLE=()   # one line per part: name, outcome, seconds taken, its box
note() {
    local box=$4
    [[ "$box" == *[0-9] ]] && box+=s
    TABLE+=("$(printf '%-10s %-24s %7s %7s' "$1" "$2" "$3s" "$box")")
}
# part NAME WANT MIN FUNCTION [ASKED]: FUNCTION runs with BOX seconds (WANT, or what is left before the
# final steps' FINAL_S if less) and must end within it; skipped when that is under MIN or when ASKED
# (default NAME) is not in PARTS
part() {
    local name=$1 want=$2 least=$3 fn=$4 asked=${5:-$1} t0=$SECONDS rc
    if [[ "$PARTS" != *" $asked "* ]]; then
        note "$name" "not asked (PARTS)" 0 -; return 0
    fi
    BOX=$(min "$want" $(( $(left) - FINAL_S )))
    if [ "$BOX" -lt "$least" ]; then
        step "$name: skipped: ${BOX}s left for it before the final steps, it needs ${least}s"
        note "$name" "skipped (no time)" 0 "$BOX"; return 0
    fi
    PART_END=$(( SECONDS + BOX ))
    step "$name (box ${BOX}s, until +${PART_END}s; budget ${BUDGET_S}s)"
    "$fn"; rc=$?
    case $rc in
        0) note "$name" ok $(( SECONDS - t0 )) "$BOX" ;;
        124|130|137) note "$name" "stopped at its box ($rc)" $(( SECONDS - t0 )) "$BOX" ;;
        *) note "$name" "failed (exit $rc)" $(( SECONDS - t0 )) "$BOX" ;;
    esac
    echo "-- $name: exit $rc after $(( SECONDS - t0 ))s"
    return 0
}
until_end() { echo $(( PART_END - SECONDS )); }
minutes() { awk "BEGIN { print $1 / 60 }"; }

# ---- the parts ----------------------------------------------------------------------------------------

part_sweep() {
    # no point starts later than MAX_MINUTES (default 6) or 50 s before the box ends; the sweep is
    # interrupted 10 s before it ends (SIGINT: the points in flight dropped, --resume runs them)
    local last=$(( $(until_end) - 50 )) rc
    if [ -n "${MAX_MINUTES:-}" ] || [[ "$PARTS" == " sweep " ]]; then
        last=$(min "$last" "$(awk "BEGIN { printf \"%d\", ${MAX_MINUTES:-6} * 60 }")")
    fi
    [ "$last" -ge 10 ] || last=10
    echo "sweep $SUITE: no point starts after ${last}s"
    timed "$(until_end)" "$PY" -m ckptbench sweep --suite "$SUITE" --out "$RUN" --resume \
        --max-minutes "$(minutes "$last")" --yes
    rc=$?
    echo "sweep exit status $rc"
    return $rc
}

part_step_time_accuracy() {
    local rc
    timed "$(until_end)" "$PY" scripts/step_time_accuracy.py --from-run "$RUN" >"$OUTDIR/step_time_accuracy.txt" 2>&1
    rc=$?
    tail -n 40 "$OUTDIR/step_time_accuracy.txt"
    [ "$rc" -eq 0 ] || echo "warning: step_time_accuracy.py --from-run exited $rc; its output is in step_time_accuracy.txt"
    return $rc
}

part_extras() {
    local last=$(( $(until_end) - 50 )) rc
    [ "$last" -ge 10 ] || last=10
    echo "sweep $EXTRAS_SUITE: no point starts after ${last}s"
    timed "$(until_end)" "$PY" -m ckptbench sweep --suite "$EXTRAS_SUITE" --out "$EXTRAS" --resume \
        --max-minutes "$(minutes "$last")" --yes
    rc=$?
    echo "extras sweep exit status $rc"
    return $rc
}

part_plan() {
    local args rc
    # PLAN_ARGS: flags, split on spaces
    args=($PLAN_ARGS)
    # the card's measured matmul rate and copy bandwidth, where calibration measured them
    if [ "$HAVE_CUDA" = 1 ] && [ -s "$RUN/calibration.json" ]; then args+=(--calibration "$RUN/calibration.json"); fi
    echo "plan ${args[*]} --optimize --verify"
    timed "$(until_end)" "$PY" -m ckptbench plan "${args[@]}" --optimize --verify --out "$PLAN" --baselines-dir "$PLAN" \
        2>&1 | tee "$OUTDIR/plan.txt"
    rc=${PIPESTATUS[0]}
    return $rc
}

part_gpu_tests() {
    local files rc
    files=$(grep -rlE "mark\.gpu|mark\(\"gpu\"\)" tests --include='*.py' | sort | tr '\n' ' ')
    if [ -z "$files" ]; then echo "no test file holds a gpu test"; return 0; fi
    if ! "$PY" -c "import pytest" 2>/dev/null; then echo "pytest is not installed here: gpu tests not run"; return 3; fi
    echo "pytest -m gpu $files"
    # $files unquoted: one argument per file
    timed "$(until_end)" "$PY" -m pytest -m gpu -q -o addopts="" -p no:cacheprovider $files \
        >"$OUTDIR/pytest-gpu.log" 2>&1
    rc=$?
    tail -n 15 "$OUTDIR/pytest-gpu.log"
    return $rc
}

# ---- the final steps: no GPU needed, within FINAL_S -----------------------------------------------------

finish() {
    step "simulated predictions"
    if [ -n "${SIMULATED:-}" ] && [ -f "$SIMULATED" ] && [ -d "$RUN" ]; then
        cp "$SIMULATED" "$RUN/simulated.jsonl" && echo "copied $SIMULATED"
    fi
    if [ ! -f "$RUN/records.jsonl" ]; then
        echo "no records: nothing to simulate"
    elif [ $(( $(left) - 30 )) -ge 20 ]; then  # the points it lacks (all when nothing was copied)
        timed $(( $(left) - 30 )) "$PY" -m ckptbench simulate-suite "$SUITE" "$RUN" \
            || echo "warning: simulation stopped early; what it wrote is kept"
    else
        echo "skipped: ${SECONDS}s spent; make it beforehand with 'ckptbench simulate-suite' and pass SIMULATED="
    fi

    local dir name
    for dir in "$RUN" "$EXTRAS"; do
        [ -f "$dir/records.jsonl" ] || continue
        step "report and GPU summary: ${dir#"$OUTDIR"/}"
        if [ "$dir" = "$RUN" ]; then name="$OUTDIR/report.html"; else name="$dir/report.html"; fi
        timed "$(min 60 $(( $(left) - 5 )))" "$PY" -m ckptbench report "$dir" -o "$name" \
            || echo "warning: the report could not be rendered; records are intact"
        timed "$(min 45 $(( $(left) - 5 )))" "$PY" -m ckptbench gpu-summary "$dir" || echo "warning: summary failed"
    done

    # the fractions this card's kernels reached, for plan on cards not here (CPU work, if time is left;
    # otherwise run it later on any machine from OUTDIR/run)
    if [ -f "$RUN/records.jsonl" ] && [ $(( $(left) - 20 )) -ge 25 ]; then
        step "achieved fractions: scripts/achieved_fit.py --from-run ${RUN#"$OUTDIR"/}"
        timed $(( $(left) - 20 )) "$PY" scripts/achieved_fit.py --from-run "$RUN" --name FITTED \
            --out "$OUTDIR/achieved_fit.py" >"$OUTDIR/achieved_fit.txt" 2>&1 \
            || echo "warning: the fit did not finish; run scripts/achieved_fit.py --from-run on the records later"
        tail -n 3 "$OUTDIR/achieved_fit.txt"
    fi

    step "pack worker logs"
    # every folder inside a results directory (the workers' logs, the step-time model's op rates, ...)
    # goes into one archive: OUTDIR stays two levels deep
    local packed=()
    for dir in "$RUN" "$EXTRAS" "$PLAN"; do
        [ -d "$dir" ] || continue
        while IFS= read -r sub; do packed+=("${dir#"$OUTDIR"/}/$sub"); done \
            < <(find "$dir" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort)
        # a finished sweep's shard locks and state are no results
        rm -f "$dir"/.sweep-*.json "$dir"/.sweep-*.lock "$dir"/.sweeps.lock
    done
    if [ "${#packed[@]}" -gt 0 ]; then
        echo "packing ${packed[*]}"
        tar -czf "$OUTDIR/logs.tar.gz" -C "$OUTDIR" "${packed[@]}" && (cd "$OUTDIR" && rm -rf "${packed[@]}")
    fi
}

main() {
step "environment"
if compgen -G ".whl/*.whl" >/dev/null; then
    echo "installing carried wheels: $(ls .whl)"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "error: could not install .whl/"; return 1; }
    export PYTHONPATH=/tmp/site:$REPO
else
    export PYTHONPATH=$REPO
fi
# versions, the torch build, devices, NVML, pinned memory, checkpointing API: `ckptbench env`, which exits 3
# when a GPU suite cannot run here
HAVE_CUDA=1
if ! timeout 90 "$PY" -m ckptbench env --gpu; then
    if [ "${ALLOW_CPU:-}" = 1 ]; then
        HAVE_CUDA=0
        echo "no usable CUDA device: ALLOW_CPU=1, going on with the CPU stand-ins (a test of this script)"
    else
        echo "error: no usable CUDA device here (above); gpu-check needs one"
        return 3
    fi
fi
local card=cpu gpu_name
if [ "$HAVE_CUDA" = 1 ]; then
    gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
    case "$gpu_name" in
        *H100*) card=h100 ;; *A100*80*) card=a100 ;; *A100*) card=a100-40 ;; *L40S*) card=l40s ;;
        *4090*) card=rtx4090 ;; *) card=h200 ;;
    esac
    SUITE=${SUITE:-suites/gpu-check.toml}
    EXTRAS_SUITE=${EXTRAS_SUITE:-suites/gpu-extras.toml}
    PLAN_ARGS=${PLAN_ARGS:-"--model llama-1b --device $card --seq 4096 --memory 60GiB"}
    case "$SUITE" in
        suites/gpu-check.toml|suites/gpu-small.toml|*/suites/gpu-check.toml|*/suites/gpu-small.toml)
            SIMULATED=${SIMULATED:-results/reference-gpu-small-sim/simulated.jsonl} ;;
    esac
else
    SUITE=${SUITE:-suites/gpu-check-cpu.toml}
    EXTRAS_SUITE=${EXTRAS_SUITE:-suites/gpu-extras-cpu.toml}
    PLAN_ARGS=${PLAN_ARGS:-"--model llama-tiny --device cpu --memory 0.01GiB --seq 64"}
fi
echo "parts:${PARTS}(budget ${BUDGET_S}s; ${FINAL_S}s kept for the final steps); card for the plan: $card"

step "calibrate: pinned host<->device bandwidth, bf16 matmul peak"
timeout 45 "$PY" -m ckptbench calibrate "$RUN" || echo "warning: calibration failed; offload bounds and MFU* will be empty"

# the main sweep has the budget to itself when it is the only part (but the step-time table's box);
# else SWEEP_BOX_S
local sweep_box=$SWEEP_BOX_S
if [[ "$PARTS" == " sweep " ]]; then sweep_box=$(( $(left) - FINAL_S - STA_BOX_S )); fi
part sweep "$sweep_box" 30 part_sweep
if [[ "$PARTS" == *" sweep "* ]] && [ ! -s "$RUN/records.jsonl" ]; then
    note step-time "skipped (no records)" 0 -
else
    part step-time "$STA_BOX_S" 10 part_step_time_accuracy sweep
fi
part extras "$EXTRAS_BOX_S" 30 part_extras
part plan "$PLAN_BOX_S" 30 part_plan
part gpu-tests "$TESTS_BOX_S" 20 part_gpu_tests
local t0=$SECONDS
finish
note final done $(( SECONDS - t0 )) "$FINAL_S"

step "parts"
printf '%-10s %-24s %7s %7s\n' part outcome took box
printf '%s\n' "${TABLE[@]}"
echo
echo "gpu-check done in ${SECONDS}s (budget ${BUDGET_S}s); results in $OUTDIR"
}

main 2>&1 | tee -a "$OUTDIR/gpu_check.log"
exit "${PIPESTATUS[0]}"
