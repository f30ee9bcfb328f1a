#!/bin/bash
# Stage 2 of the VM boot: PID 1 after switch_root, running on the overlay of the host's / (see
# initramfs-init). Runs *inside the VM*; run.sh is its host-side counterpart.
#
#  1. mounts the writable per-run directory (virtio-9p tag "rpcout", host path from rpcvm.out=) at the
#     same path as on the host, plus any extra writable shares listed in its rw_dirs file;
#  2. brings up eth0 (10.0.2.15/24, QEMU user networking), rxe0 (soft-RoCE) and siw0 (soft-iWARP, if the
#     cache has siw.ko);
#  3. runs $OUT/job.sh (written by run.sh: environment, cd, command) with stdout on ttyS1 and stderr on
#     ttyS2, which QEMU forwards to run.sh's stdout and stderr;
#  4. records the exit status in $OUT/exit_code and powers off.
# Progress markers for run.sh: $OUT/stage2.started, $OUT/setup.ok or $OUT/setup.failed, $OUT/exit_code.
# No errexit here on purpose: every failure must end in a power-off, never in a dead PID 1.
set -uo pipefail

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
GUEST_IP=10.0.2.15
OUT=""

say() { echo "rpcvm: $*"; }

power_off() {
    sync
    /bin/busybox poweroff -f
    echo o >/proc/sysrq-trigger # fallback if busybox is missing
    sleep 60
}

fail_setup() {
    say "SETUP FAILED: $*"
    [[ -n "$OUT" ]] && echo "$*" >"$OUT/setup.failed"
    power_off
}

# Runs a setup command; on failure shows its output and aborts the boot.
must() {
    local output
    output="$("$@" 2>&1)" || fail_setup "'$*' failed: $output"
}

# Waits up to $2 tenths of a second for path $1 to exist.
wait_for_path() {
    local i
    for ((i = 0; i < $2; i++)); do
        [[ -e "$1" ]] && return 0
        sleep 0.1
    done
    return 1
}

parse_cmdline() {
    local arg
    for arg in $(</proc/cmdline); do
        case "$arg" in
        rpcvm.out=*) OUT="${arg#rpcvm.out=}" ;;
        esac
    done
    [[ -n "$OUT" ]] || fail_setup "no rpcvm.out= on the kernel command line"
}

mount_shares() {
    must mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 rpcout "$OUT"
    cut -d' ' -f1 /proc/uptime >"$OUT/stage2.started"
    local i=0 dir
    if [[ -f "$OUT/rw_dirs" ]]; then
        while IFS= read -r dir; do
            must mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 "rpcrw$i" "$dir"
            i=$((i + 1))
        done <"$OUT/rw_dirs"
    fi
    mkdir -p /dev/pts /dev/shm
    must mount -t devpts devpts /dev/pts
    must mount -t tmpfs tmpfs /dev/shm
    echo rpcvm >/proc/sys/kernel/hostname
}

setup_network() {
    must modprobe virtio_net
    wait_for_path /sys/class/net/eth0 50 || fail_setup "eth0 did not appear"
    must ip link set lo up
    must ip addr add "$GUEST_IP/24" dev eth0
    must ip link set eth0 up
}

setup_rdma() {
    # crc32_generic first: without it "rdma link add" fails with ENOENT. No udev here, so the
    # user-space access modules (ib_uverbs, rdma_ucm) are loaded by hand too.
    must modprobe crc32_generic
    must modprobe rdma_rxe
    must modprobe ib_uverbs
    must modprobe rdma_ucm
    must rdma link add rxe0 type rxe netdev eth0
    wait_for_path /sys/class/infiniband/rxe0 50 || fail_setup "rxe0 did not appear"
    local devices="rxe0"

    if modinfo siw >/dev/null 2>&1; then
        must modprobe siw
        must rdma link add siw0 type siw netdev eth0
        wait_for_path /sys/class/infiniband/siw0 50 || fail_setup "siw0 did not appear"
        devices+=" siw0"
    else
        say "!!!!! WARNING: no siw.ko in the VM's module tree: siw0 (soft-iWARP) is NOT available !!!!!"
        say "!!!!! (re-run scripts/vm/setup.sh and look for the siw.ko build error)                  !!!!!"
    fi
    wait_for_path /dev/infiniband/uverbs0 50 || fail_setup "/dev/infiniband/uverbs0 did not appear"
    wait_for_path /dev/infiniband/rdma_cm 50 || fail_setup "/dev/infiniband/rdma_cm did not appear"
    echo "$devices" >"$OUT/devices"
}

run_job() {
    # Root has CAP_IPC_LOCK (so verbs registrations ignore RLIMIT_MEMLOCK), but tools and libraries
    # look at the limit too: record the kernel default, then lift it for the job.
    ulimit -l >"$OUT/memlock.default"
    ulimit -l unlimited
    local port
    for port in /dev/ttyS1 /dev/ttyS2; do
        must stty -F "$port" raw -echo
    done
    cut -d' ' -f1 /proc/uptime >"$OUT/setup.ok"
    say "ready: eth0 $GUEST_IP, devices: $(<"$OUT/devices"); memlock default $(<"$OUT/memlock.default") kB -> unlimited"
    bash "$OUT/job.sh" </dev/null >/dev/ttyS1 2>/dev/ttyS2
    local status=$?
    echo "$status" >"$OUT/exit_code"
    say "command exited with status $status"
}

parse_cmdline
mount_shares
setup_network
setup_rdma
run_job
power_off
