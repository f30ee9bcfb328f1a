#!/usr/bin/env bash
# The rdma suite in one command: the verbs integration tests, the kv demo, a short rpc-bench and the
# perftest yardstick, over soft-RoCE (rxe0) and then soft-iWARP (siw0), in ONE VM boot.
#
#   scripts/vm/rdma-suite.sh [--timeout SECS] [--bench-only]   (on the host, as root: it runs setup.sh)
#
#  1. scripts/vm/setup.sh (idempotent: packages incl. cmake/clang/rdma-core, kernel, siw.ko, initramfs);
#  2. on the host: `cargo test --no-run` with the rdma features for the test binaries rdma_seam,
#     rdma_memlock (rpc-transport), e2e_calls, e2e_failures, e2e_limits, e2e_pool, e2e_caller_drives,
#     e2e_inline, e2e_errors (rpc-core: every test file with verbs variants), and
#     `cargo build --release` of the kv example and rpc-bench with the rdma features;
#  3. in the VM, for rxe0 and then siw0 (rxe0 is deleted first: rdma_cm binds 10.0.2.15 to the first
#     device on that address), with RPC_RDMA_DEVICE=<dev> RPC_RDMA_TEST_ADDR=10.0.2.15:
#     `rpc-bench doctor --device <dev>`, each test binary with `--ignored --test-threads 2`, `kv demo`
#     over rdma://, scripts/vm/verbs-instructions.sh (the user-space instructions a 32 B echo call
#     costs the client and the server process, counted by callgrind: ~5 min per device, with its
#     critical path: the instructions from a message's arrival to the next doorbell; both split by
#     layer: scripts/layers.py), then up to RPC_RDMA_SUITE_ROUNDS rounds (default 5) of rpc-bench
#     (echo 32 B event-driven and busy-polling, the same over rpc-transport alone (`--system
#     raw-transport`: a ping-pong on the transport under rpc-core, its floor), download and upload
#     1 MiB and 16 MiB with 1 and with 4 calls in flight, a few seconds per point) and
#     scripts/vm/perftest.sh <dev>, in alternating order. Every step is bounded by what is left of
#     the VM's time; on a slow boot the rounds give way (see run_rounds: as many per device as
#     its share of the time holds, the first whenever the time left holds one; the summary says loudly which were cut);
#     the tests, the demo and the instruction count never do;
#  4. prints a summary: per device, per binary the `test result:` line, the demo status, the bench table
#     next to perftest: medians over the rounds, each round's ratio (its rpc-bench figure over its own
#     perftest run) and the median of those ratios, last on the line (under each mode's raw-transport
#     line, the RPC layers' share: each round's echo p50 minus raw-transport's, in us); then the
#     instructions per call.
#
# Options:
#   --timeout SECS  bound on the whole run (setup, builds, VM); default 3000 or $RPC_RDMA_SUITE_TIMEOUT.
#                   The VM gets what is left after setup and builds (warm: ~32 min of VM time needed
#                   with 5 rounds: ~3.5 min of tests and demo, ~110 s per round and ~4 min of
#                   instruction counting, per device; a slow boot (perftest's round trip twice the
#                   usual) needs ~45 min); the suite in it gets that less BOOT_ALLOWANCE (60 s) and
#                   cuts bench rounds to fit.
#   --bench-only    a measuring boot: doctor, rpc-bench and perftest only (no test binary, no demo);
#                   its summary says so, and it is no substitute for the suite.
# Environment: RPC_RDMA_SUITE_STEP_TIMEOUT (seconds per step in the VM, default 400; the instruction
#   count's is RPC_RDMA_SUITE_INSTR_TIMEOUT, default 900),
#   RPC_RDMA_SUITE_BENCH_SECS (seconds per bench point, default 3), RPC_RDMA_SUITE_BUSY_POLL_US (the
#   busy-poll window of the second 32 B echo run, default 2000), RPC_RDMA_SUITE_ROUNDS (rounds of
#   rpc-bench and perftest per device, default 5), RPC_VM_CACHE (see common.sh).
#
# Exit status: 0 if the doctor passed, every test binary passed and ran > 0 tests, the demo, every
# bench run and the instruction count (unless valgrind is missing: then it says so) succeeded on both
# devices (bench rounds the time bound cut are reported loudly, not counted);
# 1 if anything failed, was not run, or the VM timed out; 78 if
# this machine cannot run the VM at all (setup.sh failed, no qemu-system-x86_64, or the VM did not
# boot / set up RDMA); 2 usage.
# Logs: <cache>/out/rdma-suite-<date>-XXXX/ (printed at the end; the newest 10 are kept).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

EXIT_FAILED=1
EXIT_NO_VM=78
KEEP_SUITES=10
DEVICES=(rxe0 siw0)
GUEST_IP=10.0.2.15
# package:test-target, in the order they run.
TEST_TARGETS=(rpc-transport:rdma_seam rpc-transport:rdma_memlock rpc-core:e2e_calls rpc-core:e2e_failures rpc-core:e2e_limits
    rpc-core:e2e_pool rpc-core:e2e_caller_drives rpc-core:e2e_inline rpc-core:e2e_errors)
CARGO_FEATURES=(--features "rpc-core/rdma rpc-transport/rdma")
RELEASE_FEATURES=(--features "examples/rdma benches/rdma")

usage() {
    sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}" >&2
    exit 2
}

# ================================================================ inside the VM

STEP_TIMEOUT="${RPC_RDMA_SUITE_STEP_TIMEOUT:-400}"
BENCH_SECS="${RPC_RDMA_SUITE_BENCH_SECS:-3}"
# Calls in flight for the pipelined bandwidth points (ib_read_bw keeps up to its tx depth in flight).
PIPELINE="${RPC_RDMA_SUITE_PIPELINE:-4}"
BUSY_POLL_US="${RPC_RDMA_SUITE_BUSY_POLL_US:-2000}"
# Rounds of (rpc-bench points, perftest) per device; the host passes its value on in the manifest.
ROUNDS="${RPC_RDMA_SUITE_ROUNDS:-5}"
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "RPC_RDMA_SUITE_ROUNDS must be a positive integer" >&2; exit 2; }
# --bench-only: doctor, rpc-bench and perftest only (no test binary, no demo): a measuring boot.
BENCH_ONLY=0

# The VM's time budget: seconds from in_vm's start (the host's --timeout less setup, builds, boot
# and a margin; in the manifest). Steps are bounded by what is left of it, so that a slow boot ends
# with a summary of what ran instead of a killed VM; the bench rounds are what gives way (below).
VM_BUDGET=0
DEADLINE=0
# Seconds kept back at the end of the budget (the VM's shutdown, the host's summary).
END_MARGIN=30
# Status of a step that did not start because the budget was spent.
NO_TIME=200
# The longest bench round so far (any device), and what a first round is reckoned to take before
# any has run (~110-140 s under TCG).
LONGEST_ROUND=0
ROUND_GUESS=150
# The instruction count's own step bound: ~4-5 min per device on a usual boot, over 400 s on a slow one.
INSTR_TIMEOUT="${RPC_RDMA_SUITE_INSTR_TIMEOUT:-900}"

# Seconds left of the VM's budget (may be negative).
time_left() { echo $((DEADLINE - SECONDS)); }

# record DEV KIND NAME STATUS PASSED FAILED DETAIL: one line of results.tsv (read by the host).
record() {
    local IFS=$'\t'
    printf '%s\n' "$*" >>"$SUITE_DIR/results.tsv"
}

# run_step LOG CMD...: CMD under the step timeout, output to LOG; sets STEP_STATUS and STEP_SECS.
# A step that fails (not one that times out) is run once more: siw0 had an intermittent
# connection-setup failure ("work request failed: flushed" before the hello: a siw race, now
# worked around by `RdmaConfig::hello_nudge_after`; the retry stays as a guard). The first attempt's log
# is kept as LOG.first-attempt and the step is listed as FLAKY in the summary, never passed silently;
# a step that fails twice fails the suite. Each attempt is `bounded`; a failed one is run again
# only if time is left for it.
run_step() {
    local log="$1" t0=$SECONDS bound
    shift
    bounded "$log" "$@"
    if ((STEP_STATUS != 0 && STEP_STATUS != NO_TIME && STEP_STATUS != 124 && STEP_STATUS != 137)) && step_bound; then
        mv -f "$log" "$log.first-attempt"
        printf '%s\tfailed once (status %s), retried: %s\n' "${log#"$SUITE_DIR"/}" "$STEP_STATUS" \
            "$(grep -a -m1 -iE 'error|panicked|failed' "$log.first-attempt" | cut -c1-160)" >>"$SUITE_DIR/flaky.tsv"
        bounded "$log" "$@"
    fi
    STEP_SECS=$((SECONDS - t0))
}

# bounded LOG CMD...: one attempt of CMD, its output in LOG, bounded by STEP_BOUND (default
# STEP_TIMEOUT) and by what is left of the VM's budget; sets STEP_STATUS and STEP_BOUNDED. An
# attempt that would start with no time left is not run (status NO_TIME).
bounded() {
    local log="$1" bound
    shift
    STEP_STATUS=0
    if ! step_bound; then
        echo "not run: the VM's time budget was spent" >"$log"
        STEP_STATUS=$NO_TIME
        return
    fi
    STEP_BOUNDED=$bound
    timeout -k 10 "$bound" "$@" >"$log" 2>&1 </dev/null || STEP_STATUS=$?
}

# Sets bound (in its caller's scope) to the step's bound, cut to the budget's rest less END_MARGIN;
# fails if under 10 s would be left.
step_bound() {
    bound="${STEP_BOUND:-$STEP_TIMEOUT}"
    ((VM_BUDGET > 0)) || return 0
    local left=$(($(time_left) - END_MARGIN))
    ((left >= 10)) || return 1
    ((bound <= left)) || bound=$left
}

status_word() {
    case "$1" in
    0) echo ok ;;
    124 | 137) echo "TIMED OUT after ${STEP_BOUNDED:-$STEP_TIMEOUT} s" ;;
    "$NO_TIME") echo "NOT RUN: the VM's time budget was spent" ;;
    *) echo "FAILED (status $1)" ;;
    esac
}

# run_test DEV NAME DIR EXE: one test binary, as `cargo test` would run it, rdma tests only.
run_test() {
    local dev="$1" name="$2" dir="$3" exe="$4" log="$SUITE_DIR/$1/$2.log"
    run_step "$log" env -C "$dir" CARGO_MANIFEST_DIR="$dir" "$exe" --ignored --test-threads 2 --show-output
    local line passed failed
    line="$(grep -a '^test result:' "$log" | tail -n 1 || true)"
    passed="$(sed -n 's/.* \([0-9][0-9]*\) passed.*/\1/p' <<<"$line")"
    failed="$(sed -n 's/.* \([0-9][0-9]*\) failed.*/\1/p' <<<"$line")"
    record "$dev" test "$name" "$STEP_STATUS" "${passed:-0}" "${failed:-?}" "${line:-no test result line}"
    echo "[$dev] $name: $(status_word "$STEP_STATUS") in ${STEP_SECS} s: ${line:-no 'test result:' line (see $log)}"
}

# rpc-bench doctor --device DEV: the device's port must be ACTIVE and usable, memlock and rdma_cm in order.
run_doctor() {
    local dev="$1" log="$SUITE_DIR/$1/doctor.log"
    run_step "$log" "$BENCH_BIN" doctor --device "$dev"
    record "$dev" doctor doctor "$STEP_STATUS" - - "$(grep -a -E '^(READY|NOT READY)' "$log" | tail -n 1)"
    echo "[$dev] rpc-bench doctor: $(status_word "$STEP_STATUS") in ${STEP_SECS} s: $(grep -a -E '^(READY|NOT READY)' "$log" | tail -n 1)"
}

run_demo() {
    local dev="$1" log="$SUITE_DIR/$1/kv-demo.log"
    run_step "$log" "$KV_BIN" demo --listen "rdma://$GUEST_IP:0"
    record "$dev" demo kv-demo "$STEP_STATUS" - - "$(tail -n 1 "$log")"
    echo "[$dev] kv demo: $(status_word "$STEP_STATUS") in ${STEP_SECS} s: $(tail -n 1 "$log")"
}

# The directory of DEV's round ROUND: its bench logs and CSVs, perftest's log and raw outputs.
round_dir() { echo "$SUITE_DIR/$1/round-$2"; }

# run_benches DEV ROUND: the rpc-bench points of one round.
run_benches() {
    local dev="$1" round="$2"
    run_bench "$dev" "$round" echo echo 32
    run_bench "$dev" "$round" echo-busy echo 32 --busy-poll-us "$BUSY_POLL_US"
    # The transport's own floor in both modes: how much of the echo's round trip the RPC layers add.
    run_bench "$dev" "$round" raw echo 32 --system raw-transport
    run_bench "$dev" "$round" raw-busy echo 32 --system raw-transport --busy-poll-us "$BUSY_POLL_US"
    run_bench "$dev" "$round" download download 1M,16M
    run_bench "$dev" "$round" upload upload 1M,16M
    # ib_read_bw keeps many READs in flight: the like-for-like bandwidth point keeps calls in flight.
    run_bench "$dev" "$round" download-pipelined download 1M,16M --outstanding "$PIPELINE"
    run_bench "$dev" "$round" upload-pipelined upload 1M,16M --outstanding "$PIPELINE"
}

# run_bench DEV ROUND NAME WORKLOAD SIZES [ARGS...]: one rpc-bench run, its CSV in
# <round dir>/bench/NAME.csv; recorded as step NAME@ROUND.
run_bench() {
    local dev="$1" round="$2" name="$3" workload="$4" sizes="$5" dir
    dir="$(round_dir "$dev" "$round")"
    local log="$dir/bench-$name.log"
    shift 5
    mkdir -p "$dir"
    run_step "$log" "$BENCH_BIN" run --listen "rdma://$GUEST_IP:0" --workload "$workload" --sizes "$sizes" \
        --duration "$BENCH_SECS" --out "$dir/bench" --name "$name" --no-plots "$@"
    record "$dev" bench "$name@$round" "$STEP_STATUS" - - "$workload $sizes"
    echo "[$dev] round $round: rpc-bench $workload $sizes: $(status_word "$STEP_STATUS") in ${STEP_SECS} s"
    grep -a -A4 -E '^# (rpc-core|raw-transport) over rdma' "$log" | grep -aE '^ +[0-9]' || true
}

# run_instructions DEV: instructions per 32 B echo call of the client and the server process
# (verbs-instructions.sh: callgrind, repeatable to ~1.5% where the rounds' wall clock is not); recorded as
# step instructions. Printed, not asserted; a run that fails fails the suite like a bench point.
# The runs' profiles are kept in DEV/profiles: the scripts that read them run on the host, in the
# summary (instructions_line), where they take seconds, not minutes.
run_instructions() {
    local dev="$1" log="$SUITE_DIR/$1/instructions.log"
    rm -rf "$SUITE_DIR/$dev/profiles"
    STEP_BOUND=$INSTR_TIMEOUT run_step "$log" "$VM_SCRIPTS_DIR/verbs-instructions.sh" "$BENCH_BIN" "$dev" \
        --keep "$SUITE_DIR/$dev/profiles"
    local line
    line="$(grep -a -E '^VERBS-INSTRUCTIONS|DID NOT RUN' "$log" | tail -n 1 || true)"
    record "$dev" instructions instructions "$STEP_STATUS" - - "${line:-no VERBS-INSTRUCTIONS line}"
    echo "[$dev] instructions per call: $(status_word "$STEP_STATUS") in ${STEP_SECS} s: ${line:-see $log}"
}

# run_perftest DEV ROUND: perftest.sh for one round; recorded as step perftest@ROUND.
run_perftest() {
    local dev="$1" round="$2" dir
    dir="$(round_dir "$dev" "$round")"
    local log="$dir/perftest.log"
    mkdir -p "$dir"
    # Not run_step: a perftest that fails is reported, not retried or counted as a failure.
    bounded "$log" env RPC_VM_OUT="$dir" "$VM_SCRIPTS_DIR/perftest.sh" "$dev"
    record "$dev" perftest "perftest@$round" "$STEP_STATUS" - - "$(grep -a '^PERFTEST' "$log" || echo 'no PERFTEST line')"
    echo "[$dev] round $round: perftest: $(status_word "$STEP_STATUS"): $(grep -a '^PERFTEST' "$log" || tail -n 3 "$log")"
}

# run_round DEV ROUND: one round of rpc-bench points and perftest, the order flipped every other
# round, so that each round's ratios pair figures taken minutes apart and the summary's median ratio
# is not one sample's.
run_round() {
    if (($2 % 2 == 1)); then
        run_benches "$1" "$2"
        run_perftest "$1" "$2"
    else
        run_perftest "$1" "$2"
        run_benches "$1" "$2"
    fi
}

# run_rounds DEV LATER SETUP_SECS: up to ROUNDS rounds on DEV, as many as its share of the budget
# holds. LATER devices come after this one; each is reckoned to need 5/4 of SETUP_SECS (what DEV's
# doctor, tests, demo and instruction count took) for its own, and the rest of the budget is shared
# between DEV's rounds and theirs. The first round runs if it fits in what is left of the VM's
# time (reckoned as the longest round so far on any device, else ROUND_GUESS, and a fifth more:
# a round whose steps ran out of time would fail them); a further one only if it also fits in
# what is left of the share. Rounds cut are recorded (kind `rounds`), printed loudly in the summary, and not failures:
# they are measurements, and the tests, the demo and the instruction count run first.
run_rounds() {
    local dev="$1" later="$2" setup="$3" round t0=$SECONDS t longest=0 share expect
    if ((VM_BUDGET > 0)); then
        share=$((($(time_left) - END_MARGIN - later * setup * 5 / 4) / (later + 1)))
    fi
    for ((round = 1; round <= ROUNDS; round++)); do
        # What the next round is reckoned to take: the longest so far (on this device, else on
        # one before it, else ROUND_GUESS), and a fifth more.
        expect=$longest
        ((expect > 0)) || expect=$LONGEST_ROUND
        ((expect > 0)) || expect=$ROUND_GUESS
        expect=$((expect * 6 / 5))
        if ((VM_BUDGET > 0 && ((round > 1 && SECONDS - t0 + expect > share) || expect + 10 > $(time_left) - END_MARGIN))); then
            local which="rounds $round-$ROUNDS"
            ((round < ROUNDS)) || which="round $round"
            record "$dev" rounds cut 0 "$round" - "$which not run: this device's share of the VM's time was $share s, $((round - 1)) round(s) took $((SECONDS - t0)) s, the next reckoned at $expect s, $(time_left) s left"
            echo "!!!!! [$dev] $which NOT RUN: $((round - 1)) round(s) took $((SECONDS - t0)) s of this device's $share s share of the VM's time; the next reckoned at $expect s, $(time_left) s left"
            return
        fi
        t=$SECONDS
        run_round "$dev" "$round"
        ((SECONDS - t <= longest)) || longest=$((SECONDS - t))
        ((longest <= LONGEST_ROUND)) || LONGEST_ROUND=$longest
    done
}

# Leaves DEV where rdma_cm will pick it: rxe0 is the first device on 10.0.2.15 (nothing to do), so for
# any other device every other device is deleted first.
select_device() {
    local dev="$1" other
    [[ -e "/sys/class/infiniband/$dev" ]] || return 1
    if [[ "$dev" != rxe0 ]]; then
        for other in /sys/class/infiniband/*; do
            other="${other##*/}"
            [[ "$other" == "$dev" ]] || rdma link delete "$other" || return 1
        done
    fi
    local have=(/sys/class/infiniband/*)
    echo "[$dev] devices: ${have[*]##*/}"
}

in_vm() {
    SUITE_DIR="$1"
    # shellcheck source=/dev/null
    source "$SUITE_DIR/manifest.sh" # TESTS=(name|dir|exe ...), KV_BIN, BENCH_BIN, ROUNDS, BENCH_ONLY, VM_BUDGET
    date +%s >"$SUITE_DIR/vm.started"
    # Where the guest reads time from (run.sh picks the TSC; see RPC_VM_CLOCKSOURCE there).
    cat /sys/devices/system/clocksource/clocksource0/current_clocksource >"$SUITE_DIR/clocksource" 2>/dev/null || true
    export RPC_RDMA_TEST_ADDR="$GUEST_IP"
    ((VM_BUDGET > 0)) && DEADLINE=$((SECONDS + VM_BUDGET))
    echo "===== VM budget: ${VM_BUDGET} s (0: none)"
    local dev entry name dir exe t_dev i
    for i in "${!DEVICES[@]}"; do
        dev="${DEVICES[i]}"
        t_dev=$SECONDS
        mkdir -p "$SUITE_DIR/$dev"
        echo "===== $dev ($(date -u +%H:%M:%S))"
        if ! select_device "$dev"; then
            echo "!!!!! [$dev] device MISSING in the VM (or could not isolate it): every $dev step fails !!!!!"
            record "$dev" device "$dev" 1 - - "device missing"
            continue
        fi
        export RPC_RDMA_DEVICE="$dev"
        # A separate rdma_cm/TCP port range per device (siw's iWARP connections are TCP).
        [[ "$dev" == siw* ]] && export RPC_RDMA_TEST_PORT=20000
        run_doctor "$dev"
        for entry in "${TESTS[@]}"; do
            IFS='|' read -r name dir exe <<<"$entry"
            run_test "$dev" "$name" "$dir" "$exe"
        done
        ((BENCH_ONLY)) || run_demo "$dev"
        # The instruction count before the rounds: it is repeatable where the rounds' wall clock is
        # not, so when time runs short the rounds give way, not it.
        run_instructions "$dev"
        run_rounds "$dev" $((${#DEVICES[@]} - i - 1)) $((SECONDS - t_dev))
    done
    echo "===== done ($(date -u +%H:%M:%S))"
    touch "$SUITE_DIR/vm.done"
}

# ================================================================ on the host

# LOUD: this machine cannot run the VM at all; CI decides what that means (exit 78).
no_vm() {
    {
        echo
        echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
        echo "!!!!! rdma-suite.sh: THIS MACHINE CANNOT RUN THE RDMA VM: $*"
        echo "!!!!! NO rdma test ran. (exit $EXIT_NO_VM)"
        echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    } >&2
    exit "$EXIT_NO_VM"
}

TOTAL_TIMEOUT="${RPC_RDMA_SUITE_TIMEOUT:-3000}"
# Seconds of the VM's timeout not given to the suite inside it: the boot and RDMA set-up (~20 s
# under TCG) and the power-off.
BOOT_ALLOWANCE=60
parse_args() {
    while (($# > 0)); do
        case "$1" in
        --timeout)
            [[ "${2:-}" =~ ^[0-9]+$ ]] || usage
            TOTAL_TIMEOUT="$2"
            shift 2
            ;;
        --bench-only)
            BENCH_ONLY=1
            shift
            ;;
        *) usage ;;
        esac
    done
}

step() { printf '\n[rdma-suite] == %s (%s)\n' "$*" "$(date -u +%H:%M:%S)" >&2; }

ensure_vm_ready() {
    step "setup.sh"
    timeout "$(remaining)" "$VM_SCRIPTS_DIR/setup.sh" || no_vm "scripts/vm/setup.sh failed (status $?)"
    command -v qemu-system-x86_64 >/dev/null || no_vm "no qemu-system-x86_64 after setup.sh"
}

# Seconds left of the --timeout budget, at least 1 (`timeout 0` would mean no limit at all).
remaining() {
    local left=$((DEADLINE - $(date +%s)))
    echo $((left > 1 ? left : 1))
}

# Sets TESTS to "name|manifest_dir|executable" for each wanted test target; fails if one is missing.
build_tests() {
    step "cargo test --no-run ${CARGO_FEATURES[*]}"
    local json="$SUITE_DIR/cargo-test.json" spec pkg target line
    (cd "$VM_REPO_DIR" && timeout "$(remaining)" cargo test -p rpc-transport -p rpc-core "${CARGO_FEATURES[@]}" --no-run \
        --message-format=json-render-diagnostics >"$json") || return 1
    TESTS=()
    for spec in "${TEST_TARGETS[@]}"; do
        pkg="${spec%%:*}" target="${spec#*:}"
        line="$(jq -r --arg pkg "$pkg" --arg t "$target" '
            select(.reason == "compiler-artifact" and .profile.test and .executable != null
                   and .target.name == $t and (.package_id | test("[/#]" + $pkg + "[@#]")))
            | "\(.target.name)|\(.manifest_path | sub("/Cargo.toml$"; ""))|\(.executable)"' "$json" | tail -n 1)"
        [[ -n "$line" ]] || { vm_log "ERROR: cargo built no test binary $target in $pkg"; return 1; }
        TESTS+=("$line")
        vm_log "test binary: ${line##*|}"
    done
}

build_release() {
    step "cargo build --release ${RELEASE_FEATURES[*]}"
    (cd "$VM_REPO_DIR" && timeout "$(remaining)" cargo build --release -p examples -p benches "${RELEASE_FEATURES[@]}" \
        --bin kv --bin rpc-bench) || return 1
    KV_BIN="$VM_REPO_DIR/target/release/kv"
    BENCH_BIN="$VM_REPO_DIR/target/release/rpc-bench"
    [[ -x "$KV_BIN" && -x "$BENCH_BIN" ]]
}

write_manifest() {
    {
        echo "# generated by rdma-suite.sh on the host"
        printf 'TESTS=('
        ((${#TESTS[@]} == 0)) || printf ' %q' "${TESTS[@]}"
        printf ' )\n'
        printf 'KV_BIN=%q\nBENCH_BIN=%q\nROUNDS=%q\nBENCH_ONLY=%q\nVM_BUDGET=%q\n' "$KV_BIN" "$BENCH_BIN" "$ROUNDS" \
            "$BENCH_ONLY" "$VM_BUDGET"
    } >"$SUITE_DIR/manifest.sh"
}

# Deletes all but the newest $KEEP_SUITES suite directories.
prune_old_suites() {
    find "$RPC_VM_CACHE/out" -maxdepth 1 -name 'rdma-suite-*' -type d -printf '%T@ %p\n' | sort -rn |
        tail -n +$((KEEP_SUITES + 1)) | cut -d' ' -f2- | xargs -r rm -rf
}

# Boots the VM once for the in-VM part; sets VM_STATUS. Both outputs are also kept in the suite dir.
run_vm() {
    step "VM: ${DEVICES[*]} (timeout $VM_TIMEOUT s)"
    VM_STATUS=0
    "$VM_SCRIPTS_DIR/run.sh" --timeout "$VM_TIMEOUT" --rw "$SUITE_DIR" -- \
        "$VM_SCRIPTS_DIR/rdma-suite.sh" --in-vm "$SUITE_DIR" \
        > >(tee "$SUITE_DIR/vm-stdout.log") 2> >(tee "$SUITE_DIR/vm-stderr.log" >&2) || VM_STATUS=$?
    wait # for the tee processes
    local run_dir
    run_dir="$(sed -n 's/^\[run\.sh\] total .*(run dir \(.*\))$/\1/p' "$SUITE_DIR/vm-stderr.log" | tail -n 1)"
    [[ -n "$run_dir" && -f "$run_dir/console.log" ]] && cp "$run_dir/console.log" "$SUITE_DIR/console.log"
    return 0
}

# The result line for DEV KIND NAME, or nothing.
result_of() { awk -F'\t' -v d="$1" -v k="$2" -v n="$3" '$1 == d && $2 == k && $3 == n' "$SUITE_DIR/results.tsv" 2>/dev/null | tail -n 1; }

# Column COL of CSV FILE where workload == W and size == S.
csv_field() {
    awk -F, -v col="$2" -v w="$3" -v s="$4" '
        NR == 1 { for (i = 1; i <= NF; i++) idx[$i] = i; next }
        $idx["workload"] == w && $idx["size"] == s { print $idx[col]; exit }' "$1" 2>/dev/null || true
}

# perftest field KEY from the PERFTEST line of DEV's round ROUND: perftest_field DEV ROUND KEY.
perftest_field() {
    { grep -ao "$3=[0-9.]*" "$(round_dir "$1" "$2")/perftest.log" 2>/dev/null || true; } | head -n 1 | cut -d= -f2
}

# The median of the numbers given, "-" (no figure) skipped (the mean of the middle two for an even
# count); nothing if none (and a status of 0 then too: the summary runs under `set -e`, and a
# device whose bench points all failed still gets the rest of its summary).
median() {
    printf '%s\n' "$@" | { grep -v '^-*$' || true; } | sort -g |
        awk '{ v[NR] = $1 } END { if (NR == 0) exit; if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# ratio_of OURS REF: OURS / REF to two decimals, or "-" when either is missing ("-").
ratio_of() {
    if [[ "$1" == - || "$2" == - ]]; then
        echo -
    else
        awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'
    fi
}

# point_line LABEL UNIT OURS... -- REFLABEL REFS... -- RATIOS...: one line of the bench table: the
# medians of our figures and of perftest's over the rounds, each round's ratio ("-": that round has
# no pair), and, last, the median of the rounds' ratios (each round pairs our figure with its own
# perftest run).
point_line() {
    local label="$1" unit="$2" reflabel ours=() refs=() ratios=() per
    shift 2
    while (($# > 0)) && [[ "$1" != -- ]]; do ours+=("$1"); shift; done
    shift
    reflabel="$1"
    shift
    while (($# > 0)) && [[ "$1" != -- ]]; do refs+=("$1"); shift; done
    shift
    ratios=("$@")
    local mid
    mid="$(median "${ours[@]}")"
    if [[ -z "$mid" ]]; then
        printf '    %-36s %14s\n' "$label" missing
        return
    fi
    per="$(printf '%s ' "${ratios[@]}")"
    printf '    %-36s %8.1f %-5s  %-44s %-22s %s\n' "$label" "$mid" "$unit" \
        "$reflabel $(median "${refs[@]}")" "(${per% })" \
        "$(mid="$(median "${ratios[@]}")"; if [[ -n "$mid" ]]; then printf '%.2fx' "$mid"; else echo '?'; fi)"
}

# The rounds DEV's bench ran: ROUNDS unless the budget cut them (a `rounds cut` record whose fifth
# field is the first round not run).
rounds_run() {
    local cut
    cut="$(result_of "$1" rounds cut | cut -f5)"
    if [[ "$cut" =~ ^[0-9]+$ ]]; then echo $((cut - 1)); else echo "$ROUNDS"; fi
}

# The steady-state registration counts e2e_pool printed (client + server, per call).
pool_lines() {
    local log="$SUITE_DIR/$1/e2e_pool.log" policy label n
    for policy in PoolKeys PerCallKeys; do
        label="steady state"
        [[ "$policy" == PerCallKeys ]] && label="steady state, per-call keys"
        n="$({ grep -a "\[Rdma, $policy, batch" "$log" 2>/dev/null || true; } | tail -n 1 |
            sed -n 's/.*registrations per call (steady state): \([0-9.]*\).*/\1/p')"
        printf '  registrations per call (%s): %s\n' "$label" "${n:-missing}"
    done
}

# layers_pairs CLIENT SERVER: two `layer:N,...` lists (scripts/layers.py, same layers in the same
# order) as "layer C / S, ..."; either list as it is if it is not one (n/a).
layers_pairs() {
    if [[ "$1" != *:* || "$2" != *:* ]]; then
        echo "$1 / $2"
        return
    fi
    awk -v c="$1" -v s="$2" 'BEGIN {
        n = split(c, cs, ","); split(s, ss, ",")
        for (i = 1; i <= n; i++) {
            split(cs[i], a, ":"); split(ss[i], b, ":")
            printf "%s%s %s / %s", (i > 1 ? ", " : ""), a[1], a[2], b[2]
        }
    }'
}

# The instructions one 32 B echo call costs each process (verbs-instructions.sh's line, from the
# profiles the VM kept: the scripts run here; one that fails counts as a failure).
instructions_line() {
    local r detail profiles="$SUITE_DIR/$1/profiles" report="$SUITE_DIR/$1/instructions-report.log"
    r="$(result_of "$1" instructions instructions)"
    detail="$(cut -f7 <<<"$r")"
    echo "  user-space instructions per 32 B echo call (callgrind, event-driven; scripts/vm/verbs-instructions.sh):"
    if [[ "$detail" == VERBS-INSTRUCTIONS-KEPT* ]]; then
        if "$VM_SCRIPTS_DIR/verbs-instructions.sh" --report "$profiles" >"$report" 2>&1; then
            detail="$(grep -a '^VERBS-INSTRUCTIONS ' "$report" | tail -n 1)"
            # The parts cut at every wake-up and doorbell (~50-100 MB) are not kept once read.
            rm -rf "$profiles/cp"
        else
            printf '    !!!!! FAILED: the scripts on the profiles the VM kept (%s): %s\n' "${profiles#"$SUITE_DIR"/}" \
                "$(head -n 1 "$report")"
            FAILURES=$((FAILURES + 1))
            return
        fi
    fi
    if [[ "$detail" == VERBS-INSTRUCTIONS\ * ]]; then
        # dev=D client=N server=N client_lines=N server_lines=N client_layers=L server_layers=L
        # client_path=N server_path=N client_path_layers=L server_path_layers=L secs=A,B,C,D,E [copied=K]
        read -r _ _ c s cl sl clay slay cp sp cpl spl secs copied _ <<<"$detail"
        printf '    client %s (%s code lines), server %s (%s code lines)\n' "${c#*=}" "${cl#*=}" "${s#*=}" "${sl#*=}"
        printf '    by layer, client / server (scripts/layers.py): %s\n' "$(layers_pairs "${clay#*=}" "${slay#*=}")"
        printf '    of which from a message'"'"'s arrival to the next doorbell: client %s, server %s\n' "${cp#*=}" "${sp#*=}"
        printf '      by layer, client / server: %s\n' "$(layers_pairs "${cpl#*=}" "${spl#*=}")"
        # (The suite always keeps the profiles, so its line has both.)
        if [[ "$secs" == secs=* && "$copied" == copied=* ]]; then
            IFS=, read -r a b c2 d e <<<"${secs#*=}"
            printf '    took %s s in the VM: the two counted runs %s + %s s, the split run %s s, copying the profiles out %s s; then %s s here: the scripts on the counted runs %s s, on the split run %s s\n' \
                "$((a + b + d + ${copied#*=}))" "$a" "$b" "$d" "${copied#*=}" "$((c2 + e))" "$c2" "$e"
        fi
    else
        printf '    %s\n' "${detail:-NOT RUN}"
    fi
}

# per_round DEV CSV_A COL_A CSV_B COL_B OP: for each round, the 32 B echo's COL_A of CSV_A and its
# COL_B of CSV_B combined by OP (+ or -) to one decimal, one per line; "-" where either is missing.
per_round() {
    local dev="$1" round bench a b
    for ((round = 1; round <= ROUNDS; round++)); do
        bench="$(round_dir "$dev" "$round")/bench"
        a="$(csv_field "$bench/$2" "$3" echo 32)"
        b="$(csv_field "$bench/$4" "$5" echo 32)"
        if [[ -n "$a" && -n "$b" ]]; then
            awk -v a="$a" -v b="$b" -v op="$6" 'BEGIN { printf "%.1f\n", op == "-" ? a - b : a + b }'
        else
            echo -
        fi
    done
}

# rounds_line LABEL WHAT VALUES...: a line of the bench table for a figure without a perftest
# counterpart: the median of VALUES (in us), what they are, and each round's.
rounds_line() {
    local label="$1" what="$2" mid per
    shift 2
    mid="$(median "$@")"
    per="$(printf '%s ' "$@")"
    if [[ -z "$mid" ]]; then
        printf '    %-36s %14s\n' "$label" missing
    else
        printf '    %-36s %8.1f %-5s  %-44s %s\n' "$label" "$mid" us "$what" "(${per% })"
    fi
}

# cpu_line DEV CSV MODE: the CPU time per call of the client's and the server's process (user and
# kernel, rpc-bench's cpu columns) of the 32 B echo, their sum's median over the rounds and each
# round's. Event-driven it is what a call costs the VM's CPUs (about the round trip when both
# processes share a vCPU); busy-polling it includes the spinning (about one CPU per process).
cpu_line() {
    local sums
    mapfile -t sums < <(per_round "$1" "$2" client_cpu_us "$2" server_cpu_us +)
    rounds_line "echo 32 B CPU/call c+s ($3)" "client + server process" "${sums[@]}"
}

# gap_line DEV CSV RAWCSV MODE: what the RPC layers add to the transport's 32 B round trip: each
# round's echo p50 minus raw-transport's p50 of the same round, and their median. Both run minutes
# apart from perftest but seconds apart from each other, so this moves less from round to round
# than either ratio, and it is what a leaner small-call path cuts (with each side's critical path,
# below, in instructions).
gap_line() {
    local gaps
    mapfile -t gaps < <(per_round "$1" "$2" p50_us "$3" p50_us -)
    rounds_line "RPC layers' share ($4)" "echo - raw transport, same round" "${gaps[@]}"
}

# echo_ratio_line DEV CSV KEY LABEL REFLABEL: the 32 B echo p50 of CSV in each round next to twice
# perftest's KEY of the same round, as a point_line.
echo_ratio_line() {
    local dev="$1" csv="$2" key="$3" round bench p50 lat ref ours=() refs=() ratios=()
    for ((round = 1; round <= ROUNDS; round++)); do
        bench="$(round_dir "$dev" "$round")/bench"
        p50="$(csv_field "$bench/$csv" p50_us echo 32)"
        lat="$(perftest_field "$dev" "$round" "$key")"
        ref="$(awk -v l="$lat" 'BEGIN { if (l > 0) printf "%.2f", 2 * l }')"
        ours+=("${p50:--}")
        refs+=("${ref:--}")
        ratios+=("$(ratio_of "${p50:--}" "${ref:--}")")
    done
    point_line "$4" us "${ours[@]}" -- "$5" "${refs[@]}" -- "${ratios[@]}"
}

bench_table() {
    local dev="$1" round bench p50 lat ref gbps mibps key tool csv raw mode run w sz label
    local ours refs ratios
    echo "  bench (rpc-bench, release, 1 conn x 1 outstanding unless said, ${BENCH_SECS} s/point) vs perftest, same boot,"
    echo "  $(rounds_run "$dev") of $ROUNDS round(s) run, alternated; medians over the rounds, each round's ratio, then the median ratio:"
    printf '    %-36s %14s  %-44s %-22s %s\n' point ours perftest "per round" ratio
    for mode in busy-poll event-driven; do
        if [[ "$mode" == busy-poll ]]; then
            csv=echo-busy.csv raw=raw-busy.csv key=send_lat_typical_us tool="ib_send_lat"
        else
            csv=echo.csv raw=raw.csv key=send_lat_event_typical_us tool="ib_send_lat -e"
        fi
        echo_ratio_line "$dev" "$csv" "$key" "echo 32 B p50 RTT ($mode)" "2 x $tool t_typical [us]"
        cpu_line "$dev" "$csv" "$mode"
        echo_ratio_line "$dev" "$raw" "$key" "raw transport 32 B p50 RTT ($mode)" "2 x $tool t_typical [us]"
        gap_line "$dev" "$csv" "$raw" "$mode"
    done
    for run in download upload download-pipelined upload-pipelined; do
        w="${run%-pipelined}"
        for sz in 1048576 16777216; do
            label="$w $((sz >> 20)) MiB"
            [[ "$run" == *-pipelined ]] && label="$label, $PIPELINE in flight"
            key=read_bw_1MiB_MBps
            ((sz == 16777216)) && key=read_bw_16MiB_MBps
            ours=() refs=() ratios=()
            for ((round = 1; round <= ROUNDS; round++)); do
                gbps="$(csv_field "$(round_dir "$dev" "$round")/bench/$run.csv" gb_per_sec "$w" "$sz")"
                ref="$(perftest_field "$dev" "$round" "$key")"
                # perftest prints 0.00 MB/sec when its clock sampling fails under TCG: no figure.
                if ! awk -v r="${ref:-0}" 'BEGIN { exit !(r > 0) }'; then ref=""; fi
                mibps=-
                if [[ -n "$gbps" ]]; then mibps="$(awk -v g="$gbps" 'BEGIN { printf "%.1f", g * 1e9 / 1048576 }')"; fi
                ours+=("$mibps")
                refs+=("${ref:--}")
                ratios+=("$(ratio_of "$mibps" "${ref:--}")")
            done
            point_line "$label" MiB/s "${ours[@]}" -- "ib_read_bw $((sz >> 20)) MiB [MB/s]" "${refs[@]}" -- "${ratios[@]}"
        done
    done
}

# Prints the summary; sets FAILURES to the number of failed, missing or empty steps.
summarize() {
    FAILURES=0
    local dev entry name r status passed detail steps
    echo
    echo "==================== rdma suite summary ===================="
    echo "guest clocksource: $(cat "$SUITE_DIR/clocksource" 2>/dev/null || echo unknown)"
    for dev in "${DEVICES[@]}"; do
        echo "$dev:"
        r="$(result_of "$dev" device "$dev")"
        [[ -n "$r" ]] && { echo "  !!!!! $dev MISSING in the VM"; FAILURES=$((FAILURES + 1)); }
        r="$(result_of "$dev" doctor doctor)"
        if [[ -z "$r" ]]; then
            printf '  %-14s NOT RUN\n' doctor
            FAILURES=$((FAILURES + 1))
        else
            IFS=$'\t' read -r _ _ _ status _ _ detail <<<"$r"
            if ((status == 0)); then
                printf '  %-14s ok: %s\n' doctor "$detail"
            else
                printf '  %-14s FAILED (status %s): %s (see %s/doctor.log)\n' doctor "$status" "$detail" "$dev"
                FAILURES=$((FAILURES + 1))
            fi
        fi
        for entry in "${TESTS[@]}"; do
            name="${entry%%|*}"
            r="$(result_of "$dev" test "$name")"
            if [[ -z "$r" ]]; then
                printf '  %-14s NOT RUN\n' "$name"
                FAILURES=$((FAILURES + 1))
                continue
            fi
            IFS=$'\t' read -r _ _ _ status passed _ detail <<<"$r"
            if ((status != 0)); then
                printf '  %-14s FAILED (status %s): %s\n' "$name" "$status" "$detail"
                FAILURES=$((FAILURES + 1))
            elif ((passed == 0)); then
                printf '  %-14s FAILED: ran 0 tests: %s\n' "$name" "$detail"
                FAILURES=$((FAILURES + 1))
            else
                printf '  %-14s %s\n' "$name" "$detail"
            fi
        done
        local all_steps=() ok_steps=() round ran
        ran="$(rounds_run "$dev")"
        ((BENCH_ONLY)) || all_steps+=(demo:kv-demo)
        for ((round = 1; round <= ran; round++)); do
            for name in echo echo-busy raw raw-busy download upload download-pipelined upload-pipelined; do
                all_steps+=("bench:$name@$round")
            done
            all_steps+=("perftest:perftest@$round")
        done
        all_steps+=(instructions:instructions)
        for steps in "${all_steps[@]}"; do
            r="$(result_of "$dev" "${steps%%:*}" "${steps#*:}")"
            status="$(cut -f4 <<<"$r")"
            if [[ -z "$r" ]]; then
                printf '  %-14s NOT RUN\n' "${steps#*:}"
            elif ((status == 0)); then
                ok_steps+=("${steps#*:}")
                continue
            else
                printf '  %-14s FAILED (status %s)\n' "${steps#*:}" "$status"
            fi
            # perftest is the yardstick, not our code: its failure is shown but does not fail the suite.
            if [[ "$steps" == perftest:* ]]; then
                echo "  (perftest failure is reported, not counted)"
            else
                FAILURES=$((FAILURES + 1))
            fi
        done
        printf '  %-14s %s\n' ok: "${ok_steps[*]:-none}" | fold -s -w 110 | sed '2,$s/^/                 /'
        if ((ran < ROUNDS)); then
            printf '  !!!!! %s\n' "$(result_of "$dev" rounds cut | cut -f7)"
            echo "  !!!!! (bench rounds cut to fit the time bound are reported, not counted as failures; tests, demo and instruction count are never cut)"
        fi
        if ((BENCH_ONLY)); then
            echo "  tests and demo: not run (--bench-only)"
        else
            pool_lines "$dev"
        fi
        bench_table "$dev"
        instructions_line "$dev"
    done
    if [[ -s "$SUITE_DIR/flaky.tsv" ]]; then
        echo
        echo "!!!!! FLAKY steps (failed once, then passed on the one retry; first-attempt logs kept):"
        sed 's/^/  !!!!! /' "$SUITE_DIR/flaky.tsv"
    fi
}

main_host() {
    parse_args "$@"
    local t0
    t0="$(vm_now)"
    DEADLINE=$(($(date +%s) + TOTAL_TIMEOUT))
    ensure_vm_ready
    command -v jq >/dev/null || no_vm "jq missing after setup.sh"
    mkdir -p "$RPC_VM_CACHE/out"
    prune_old_suites
    SUITE_DIR="$(mktemp -d "$RPC_VM_CACHE/out/rdma-suite-$(date +%Y%m%d-%H%M%S)-XXXX")"
    vm_log "logs: $SUITE_DIR"
    TESTS=()
    if ((BENCH_ONLY)); then
        vm_log "--bench-only: no test binary and no demo run in this boot"
    else
        build_tests || { vm_log "ERROR: building the rdma test binaries failed"; exit "$EXIT_FAILED"; }
    fi
    build_release || { vm_log "ERROR: building kv / rpc-bench (release, rdma) failed"; exit "$EXIT_FAILED"; }
    local t_built
    t_built="$(vm_now)"
    VM_TIMEOUT="$(remaining)"
    if ((VM_TIMEOUT < BOOT_ALLOWANCE + 60)); then
        vm_log "ERROR: --timeout $TOTAL_TIMEOUT s nearly spent before the VM started: FAILED"
        exit "$EXIT_FAILED"
    fi
    VM_BUDGET=$((VM_TIMEOUT - BOOT_ALLOWANCE))
    write_manifest
    run_vm
    local t_vm
    t_vm="$(vm_now)"

    if [[ ! -f "$SUITE_DIR/vm.started" ]] && ((VM_STATUS == 125)); then
        no_vm "the VM did not boot or could not set up RDMA (see $SUITE_DIR/vm-stderr.log)"
    fi
    summarize >"$SUITE_DIR/summary.txt" # not in a pipe: FAILURES must reach this shell
    cat "$SUITE_DIR/summary.txt"
    {
        echo
        echo "timings: setup+builds $(vm_elapsed "$t0" "$t_built") s, VM $(vm_elapsed "$t_built" "$t_vm") s," \
            "total $(vm_elapsed "$t0" "$t_vm") s"
        echo "logs: $SUITE_DIR  (per device: <dev>/*.log, bench CSVs, perftest raw outputs; console.log)"
    } | tee -a "$SUITE_DIR/summary.txt"
    if ((VM_STATUS == 124)); then
        echo "!!!!! rdma suite: the VM TIMED OUT after $VM_TIMEOUT s: FAILED" | tee -a "$SUITE_DIR/summary.txt"
        exit "$EXIT_FAILED"
    fi
    if ((VM_STATUS != 0 && VM_STATUS != 1)) || [[ ! -f "$SUITE_DIR/vm.done" ]]; then
        echo "!!!!! rdma suite: the VM run ended abnormally (status $VM_STATUS): FAILED" |
            tee -a "$SUITE_DIR/summary.txt"
        exit "$EXIT_FAILED"
    fi
    if ((FAILURES > 0)); then
        echo "rdma suite FAILED: $FAILURES failed or missing step(s)" | tee -a "$SUITE_DIR/summary.txt"
        exit "$EXIT_FAILED"
    fi
    if ((BENCH_ONLY)); then
        echo "rdma suite (--bench-only: no tests, no demo) passed on ${DEVICES[*]}" | tee -a "$SUITE_DIR/summary.txt"
    else
        echo "rdma suite passed on ${DEVICES[*]}" | tee -a "$SUITE_DIR/summary.txt"
    fi
}

if [[ "${1:-}" == "--in-vm" ]]; then
    in_vm "${2:?--in-vm needs the suite directory}"
else
    main_host "$@"
fi
