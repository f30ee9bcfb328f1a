# shellcheck shell=bash
# Shared settings and helpers for the soft-RoCE / soft-iWARP VM harness.
# Sourced by setup.sh, run.sh and check.sh (never executed on its own).
#
# Cache layout (all under $RPC_VM_CACHE, git-ignored):
#   kernel/            unpacked linux-image (boot/vmlinuz-*, lib/modules/<kver>/, plus updates/siw.ko)
#   kernel.env         KVER=..., DEBVER=... of the unpacked kernel (written last: "kernel is ready")
#   initramfs.cpio.gz  stage-1 initramfs (busybox + virtio/9p/overlay modules + initramfs-init)
#   initramfs.stamp    hash of the inputs the initramfs was built from
#   out/run-*/         one writable directory per run.sh invocation (job, markers, console.log)
#   debs/ build/       scratch space of setup.sh (removed after a successful build)

VM_SCRIPTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VM_REPO_DIR="$(cd "$VM_SCRIPTS_DIR/../.." && pwd)"
# Defaults to <repo>/vm, i.e. /work/main/vm for the main checkout.
RPC_VM_CACHE="${RPC_VM_CACHE:-$VM_REPO_DIR/vm}"

vm_log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }
vm_die() {
    printf '[%s] ERROR: %s\n' "$(basename "$0")" "$*" >&2
    exit 1
}

# Seconds since the epoch with millisecond precision, for timing steps.
vm_now() { date +%s.%3N; }
# Elapsed seconds between two vm_now stamps, e.g. "3.2".
vm_elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# Loads KVER and DEBVER of the cached kernel; fails if setup.sh has not completed.
vm_load_kernel_env() {
    local env_file="$RPC_VM_CACHE/kernel.env"
    [[ -f "$env_file" ]] || vm_die "no cached kernel in $RPC_VM_CACHE: run scripts/vm/setup.sh first"
    # shellcheck source=/dev/null
    source "$env_file"
    VM_KERNEL_IMAGE="$RPC_VM_CACHE/kernel/boot/vmlinuz-$KVER"
    VM_MODULES_DIR="$RPC_VM_CACHE/kernel/lib/modules/$KVER"
    VM_INITRAMFS="$RPC_VM_CACHE/initramfs.cpio.gz"
    [[ -f "$VM_KERNEL_IMAGE" && -d "$VM_MODULES_DIR" && -f "$VM_INITRAMFS" ]] ||
        vm_die "cache in $RPC_VM_CACHE is incomplete: run scripts/vm/setup.sh"
}
