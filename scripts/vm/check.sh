#!/usr/bin/env bash
# Smoke test of the VM harness, in one VM boot:
#   ibv_devices, ibv_devinfo -d rxe0, rdma link;
#   whether 64 MiB memory registrations fit the VM's memlock limit (mr-probe.c);
#   perftest.sh (ib_send_lat, ib_read_bw at 1 MiB and 16 MiB) for rxe0 and siw0.
# Exits non-zero if the VM, a device, a perftest run or the 64 MiB registration under run.sh's
# limits fails. Runs setup.sh first if the cache is not ready.
#
#   scripts/vm/check.sh            (on the host)
#   scripts/vm/check.sh --in-vm P  (internal: the part that runs in the VM; P = mr-probe binary)
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DEVICES=(rxe0 siw0)
MIB64=$((64 << 20))

section() { printf '\n===== %s\n' "$*"; }

# ---------------------------------------------------------------- inside the VM

# Informational: does a 64 MiB registration work under a given memlock limit and user?
probe_memlock() {
    local probe="$1" default_kb
    default_kb="$(<"$RPC_VM_OUT/memlock.default")"
    echo "kernel default RLIMIT_MEMLOCK: $default_kb kB; run.sh runs commands with: $(ulimit -l)"
    printf 'root, ulimit -l %s:  ' "$(ulimit -l)"
    "$probe" rxe0 "$MIB64" || return 1
    printf 'root, ulimit -l %s (default):  ' "$default_kb"
    (ulimit -l "$default_kb" && "$probe" rxe0 "$MIB64") || true
    printf 'uid 65534, ulimit -l %s (default):  ' "$default_kb"
    (ulimit -l "$default_kb" && setpriv --reuid=65534 --regid=65534 --clear-groups "$probe" rxe0 "$MIB64") ||
        true
    echo "(root has CAP_IPC_LOCK, which lets verbs registrations exceed RLIMIT_MEMLOCK)"
}

in_vm() {
    local probe="$1" failed=() dev
    section "ibv_devices"
    ibv_devices
    section "ibv_devinfo -d rxe0"
    ibv_devinfo -d rxe0
    section "rdma link"
    rdma link
    section "device limits"
    for dev in "${DEVICES[@]}"; do
        [[ -e "/sys/class/infiniband/$dev" ]] || continue
        echo "$dev: $(ibv_devinfo -v -d "$dev" |
            grep -E '^\s*(max_mr_size|max_qp_wr|max_sge|max_cqe|max_qp_rd_atom|max_msg_sz|active_mtu):' |
            awk '{ printf "%s %s  ", $1, $2 }')"
    done
    section "memlock: 64 MiB registrations"
    probe_memlock "$probe" || failed+=("64 MiB registration")

    local summary="$RPC_VM_OUT/perftest-summary"
    : >"$summary"
    for dev in "${DEVICES[@]}"; do
        section "perftest $dev"
        if [[ ! -e "/sys/class/infiniband/$dev" ]]; then
            echo "!!!!! $dev is MISSING in the VM !!!!!"
            failed+=("$dev missing")
        elif ! "$VM_SCRIPTS_DIR/perftest.sh" "$dev" | tee -a "$summary"; then
            failed+=("perftest $dev")
        fi
    done

    section "summary"
    grep '^PERFTEST' "$summary" || true
    if ((${#failed[@]} > 0)); then
        echo "check FAILED: ${failed[*]}"
        return 1
    fi
    echo "check passed"
}

# ---------------------------------------------------------------- on the host

# Compiles mr-probe into the cache (on the host: the VM runs host binaries, and cc is 17x slower there).
build_probe() {
    local src="$VM_SCRIPTS_DIR/mr-probe.c" bin="$RPC_VM_CACHE/bin/mr-probe"
    if [[ ! -x "$bin" || "$src" -nt "$bin" ]]; then
        mkdir -p "$RPC_VM_CACHE/bin"
        cc -O2 -Wall -o "$bin" "$src" -libverbs
    fi
    echo "$bin"
}

on_host() {
    local t0 probe status=0
    t0="$(vm_now)"
    [[ -f "$RPC_VM_CACHE/kernel.env" && -f "$RPC_VM_CACHE/initramfs.cpio.gz" ]] || "$VM_SCRIPTS_DIR/setup.sh"
    probe="$(build_probe)"
    "$VM_SCRIPTS_DIR/run.sh" --timeout "${RPC_VM_CHECK_TIMEOUT:-1500}" -- \
        "$VM_SCRIPTS_DIR/check.sh" --in-vm "$probe" || status=$?
    vm_log "check.sh total: $(vm_elapsed "$t0" "$(vm_now)") s, status $status"
    exit "$status"
}

if [[ "${1:-}" == "--in-vm" ]]; then
    in_vm "${2:?--in-vm needs the mr-probe path}"
else
    on_host
fi
