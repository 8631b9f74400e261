#!/usr/bin/env bash
# gpu-check: the GPU path end to end in under ten minutes on one CUDA device.
#
#   bash scripts/gpu_check.sh OUTDIR          (make gpu-check OUT=OUTDIR)
#
# Runs with the machine's own python3 and packages: no virtual environment, no network.  When .whl/ holds
# wheels (see README, "GPU"), they are installed into /tmp/site first and put ahead on PYTHONPATH.
# Environment: PYTHON (default python3), SUITE (default suites/gpu-small.toml), MAX_MINUTES (default 6:
# no point starts later), BUDGET_S (default 540: the whole script ends within it, for a 600 s limit), SIMULATED (a simulated.jsonl made beforehand with `ckptbench simulate-suite`;
# without it the simulation runs here if time is left), ALLOW_CPU=1 (run on a machine without CUDA: only
# to test this script itself with a CPU suite).
#
# OUTDIR receives at most 12 files, none deeper than OUTDIR/run/: run/records.jsonl, run/timelines.jsonl
# (memory timelines), run/calibration.jsonl (the speed kernel's readings), run/suite.toml,
# run/calibration.json, run/simulated.jsonl, run/summary.json, report.html, report.checks.csv,
# logs.tar.gz (per-point worker logs and the step-time model's op rates), gpu_check.log (everything printed here).
set -uo pipefail

OUTDIR=${1:?usage: scripts/gpu_check.sh OUTDIR}
PY=${PYTHON:-python3}
SUITE=${SUITE:-suites/gpu-small.toml}
MAX_MINUTES=${MAX_MINUTES:-6}
BUDGET_S=${BUDGET_S:-540}
cd "$(dirname "$0")/.."
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
RUN="$OUTDIR/run"
export PYTHONUNBUFFERED=1
# torch.cuda.is_available() through NVML: the fork server must never initialise CUDA before forking.
export PYTORCH_NVML_BASED_CUDA_CHECK=1
step() { echo; echo "== [$(date +%H:%M:%S) +${SECONDS}s] $*"; }

main() {
step "environment"
if compgen -G ".whl/*.whl" >/dev/null; then
    echo "installing carried wheels: $(ls .whl)"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "error: could not install .whl/"; return 1; }
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
# versions, the torch build, devices, NVML, pinned memory, checkpointing API: `ckptbench env`, which exits 3
# when a GPU suite cannot run here
if ! "$PY" -m ckptbench env --gpu; then
    if [ "${ALLOW_CPU:-}" = 1 ]; then
        echo "no usable CUDA device: ALLOW_CPU=1, going on (tests of this script with a CPU suite)"
    else
        echo "error: no usable CUDA device here (above); gpu-check needs one"
        return 3
    fi
fi

step "calibrate: pinned host<->device bandwidth, bf16 matmul peak"
timeout 60 "$PY" -m ckptbench calibrate "$RUN" || echo "warning: calibration failed; offload bounds and MFU* will be empty"

# One deadline for the whole script (BUDGET_S from its start): no point starts later than 150 s before
# it, the sweep is interrupted 90 s before it, and what is left goes to the report and the summary.
LEFT=$(( BUDGET_S - SECONDS ))
SWEEP_S=$(( ${MAX_MINUTES%.*} * 60 ))
[ "$SWEEP_S" -le $(( LEFT - 150 )) ] || SWEEP_S=$(( LEFT - 150 ))
[ "$SWEEP_S" -ge 30 ] || SWEEP_S=30
step "sweep $SUITE (no point starts after ${SWEEP_S}s; budget ${BUDGET_S}s, ${LEFT}s left)"
timeout -s INT -k 20 $(( LEFT - 90 )) "$PY" -m ckptbench sweep --suite "$SUITE" --out "$RUN" --resume \
    --max-minutes "$(awk "BEGIN { print $SWEEP_S / 60 }")" --yes
echo "sweep exit status $?"

step "simulated predictions"
if [ -n "${SIMULATED:-}" ] && [ -f "$SIMULATED" ]; then
    cp "$SIMULATED" "$RUN/simulated.jsonl" && echo "copied $SIMULATED"
elif [ $(( BUDGET_S - SECONDS )) -gt 120 ]; then
    timeout $(( BUDGET_S - SECONDS - 90 )) "$PY" -m ckptbench simulate-suite "$SUITE" "$RUN" \
        || echo "warning: simulation stopped early; what it wrote is kept"
else
    echo "skipped: ${SECONDS}s spent; make it beforehand with 'ckptbench simulate-suite' and pass SIMULATED="
fi

step "report"
timeout 60 "$PY" -m ckptbench report "$RUN" -o "$OUTDIR/report.html" \
    || echo "warning: the report could not be rendered; records are intact"

step "pack worker logs and op rates"
# the workers' logs and the step-time model's op rates (one file per machine setting) go in one archive:
# what the device returns is a flat folder of at most a dozen files
packed=()
for d in work op-rates; do
    if [ -d "$RUN/$d" ]; then packed+=("$d"); fi
done
if [ "${#packed[@]}" -gt 0 ]; then
    tar -czf "$OUTDIR/logs.tar.gz" -C "$RUN" "${packed[@]}" && (cd "$RUN" && rm -rf "${packed[@]}")
fi
# the finished sweep's shard locks and state are no results: the file budget above is for results
rm -f "$RUN"/.sweep-*.json "$RUN"/.sweep-*.lock "$RUN"/.sweeps.lock

step "summary and estimate checks"
"$PY" -m ckptbench gpu-summary "$RUN" || echo "warning: summary failed"
echo
echo "gpu-check done in ${SECONDS}s; results in $OUTDIR"
}

main 2>&1 | tee -a "$OUTDIR/gpu_check.log"
exit "${PIPESTATUS[0]}"
