#!/usr/bin/env bash
# The checks that need a GPU, in one run: the GPU benchmarks (metric device, token-level and pooled
# capture throughput, a token-level task's steps), then the CUDA tests (last: on a lent machine
# with minutes of device time, the numbers come back first). CI has no GPU, and these tests skip
# there; run this on a machine with one (`make gpu-check`, or `bash scripts/gpu_check.sh OUT_DIR`
# where the project is already installed) and put the numbers in the closing note.
#
# Every step writes its own log under OUT_DIR (default bench/out/gpu-check) and runs under a time
# limit, so a hang costs one step, not the session. Output goes to files, never through a pipe:
# Ray's processes inherit a pipe and keep it open after pytest ends. The summary
# (OUT_DIR/summary.txt) has each step's exit status and its result lines.
#
# Environment: STEP_SECONDS (default 600) bounds each step; CAPTURE_N (default 7500: ~200k tokens)
# sizes the token-level capture, CAPTURE_1B_N (default 2000: ~54k tokens) the 1B decoder's.
set -u
cd "$(dirname "$0")/.."
OUT_DIR=${1:-bench/out/gpu-check}
STEP_SECONDS=${STEP_SECONDS:-600}
CAPTURE_N=${CAPTURE_N:-7500}
CAPTURE_1B_N=${CAPTURE_1B_N:-2000}
PYTHON=${PYTHON:-python}
mkdir -p "$OUT_DIR"
summary="$OUT_DIR/summary.txt"
: > "$summary"

if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" </dev/null; then
    echo "no CUDA device here (torch.cuda.is_available() is False): run this on a GPU machine" >&2
    exit 2
fi
"$PYTHON" -c "import torch; print('device:', torch.cuda.get_device_name(0), '| torch', torch.__version__)" \
    </dev/null >> "$summary"

# step NAME PATTERN COMMAND...: run COMMAND under the step limit, log to OUT_DIR/NAME.log, and copy
# the log's lines that match PATTERN (its results) into the summary
step() {
    local name=$1 pattern=$2
    shift 2
    local started=$SECONDS
    timeout -k 10 "$STEP_SECONDS" "$@" </dev/null >"$OUT_DIR/$name.log" 2>&1
    local status=$?
    echo "== $name: exit $status in $((SECONDS - started)) s$([ $status = 124 ] && echo ' (timed out)')" >> "$summary"
    grep -E "$pattern" "$OUT_DIR/$name.log" | tail -20 >> "$summary"
}

step metric_device "ratio|device|roofline" "$PYTHON" bench/metric_device.py
cp bench/out/metric_device.json "$OUT_DIR/" 2>/dev/null
# the capture job's own line for each capture (laid out, replicas ready, shards written, committed)
# and each replica's account (tokenising, waiting, computing, writing) say where a slow one went
step capture_tokens "ratio|stored:|baseline|bare forward|capture,|job:|replica [0-9]" \
    "$PYTHON" bench/capture_throughput.py --pooling tokens --n "$CAPTURE_N"
cp bench/out/capture_throughput.json "$OUT_DIR/capture_tokens.json" 2>/dev/null
# the same capture with the replica's shards written by one-CPU Ray tasks (each shard copied into Ray's
# object store) instead of its writer threads: which of the two the node's host keeps up with
ACTSTORE_GPU_WRITES=ray-tasks step capture_tokens_ray_writes "ratio|capture,|job:|replica [0-9]" \
    "$PYTHON" bench/capture_throughput.py --pooling tokens --n "$CAPTURE_N" --rounds 1
cp bench/out/capture_throughput.json "$OUT_DIR/capture_tokens_ray_writes.json" 2>/dev/null
# where a token-level capture task's time goes beyond the forward: the host's steps on a GPU
step capture_steps "bare forward|of bare" "$PYTHON" bench/capture_steps.py
cp bench/out/capture_steps.json "$OUT_DIR/" 2>/dev/null
step capture_pooled "ratio|baseline" "$PYTHON" bench/capture_throughput.py
cp bench/out/capture_throughput.json "$OUT_DIR/capture_pooled.json" 2>/dev/null
# a 1B-class decoder (random weights from a config), every hidden state token-level in bfloat16,
# and what this node's disk absorbs through the store's host path (the sink: no GPU needed)
step capture_1b "ratio|stored:|baseline|model:|capture,|job:|replica [0-9]" \
    "$PYTHON" bench/capture_throughput.py --pooling tokens --dtype bfloat16 --model-config llama-1b \
    --n "$CAPTURE_1B_N" --rounds 1
cp bench/out/capture_throughput.json "$OUT_DIR/capture_1b.json" 2>/dev/null
step capture_sink "W=|host path|store/floor" "$PYTHON" bench/capture_sink.py --writers 8 --rounds 1 --targets local \
    --dtypes bfloat16,float16
cp bench/out/capture_sink.json "$OUT_DIR/" 2>/dev/null

# the CUDA cases of the metric accumulators and of the model adapter, then capture and queries on a
# cluster whose Ray sees the GPU (the capture replicas take it, metric tasks a share)
step tests "passed|failed|^(FAILED|ERROR)" "$PYTHON" -m pytest -q -p no:cacheprovider -rfE --tb=short --timeout 300 \
    tests/metrics/test_devices.py tests/workers/test_models.py tests/workers/test_capture.py \
    tests/server/test_capture.py tests/server/test_metric_devices.py

cat "$summary"
