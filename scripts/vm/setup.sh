#!/usr/bin/env bash
# Prepares everything the soft-RoCE / soft-iWARP VM harness needs, idempotently:
#   1. installs the host packages (qemu, busybox, rdma-core, perftest, kernel build tools, ...);
#   2. downloads Debian's stock kernel image and unpacks it into the cache (never installed on the host);
#   3. builds siw.ko (soft-iWARP; Debian builds its kernels without it) out of tree against the exactly
#      matching linux-headers, and adds it to the cached module tree;
#   4. builds the small stage-1 initramfs that mounts the host / over virtio-9p.
# Everything lands in ${RPC_VM_CACHE:-<repo>/vm}; a second run with a warm cache only checks and returns.
# Needs root and Debian's package mirror (nothing else is downloaded).
#
# Environment:
#   RPC_VM_CACHE    cache directory (default <repo>/vm, i.e. /work/main/vm)
#   RPC_VM_REFRESH  set to 1 to forget the cached kernel, siw.ko and initramfs and rebuild them
set -euo pipefail
shopt -s inherit_errexit # errexit also inside $(...), e.g. kbuild="$(unpack_kernel_headers)"

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# Host packages. rdma-core & co. are used *inside* the VM too: the VM runs the host's filesystem.
HOST_PACKAGES=(
    qemu-system-x86 busybox-static cpio xz-utils gzip kmod iproute2 procps coreutils
    rdma-core ibverbs-providers ibverbs-utils perftest libibverbs-dev librdmacm-dev
    build-essential gcc-12 bc flex bison libelf-dev binutils
    cmake clang libclang-dev pkg-config jq
)
# Modules the stage-1 initramfs needs to reach the host filesystem (their dependencies are added).
INITRAMFS_MODULES=(virtio_pci 9pnet_virtio 9p overlay)

# apt-get download into the current directory, without the "_apt cannot access" sandbox warning.
# Stale package lists (a 404 for a superseded version) get one `apt-get update` and a retry.
apt_download() {
    apt-get -q -o APT::Sandbox::User=root download "$@" ||
        { apt-get -q update && apt-get -q -o APT::Sandbox::User=root download "$@"; }
}

step_start() {
    STEP_NAME="$1"
    STEP_T0="$(vm_now)"
    vm_log "== $STEP_NAME"
}
step_end() { vm_log "   $STEP_NAME: ${1:-done} ($(vm_elapsed "$STEP_T0" "$(vm_now)") s)"; }

install_host_packages() {
    step_start "host packages"
    local missing=() pkg
    for pkg in "${HOST_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
    done
    if ((${#missing[@]} == 0)); then
        step_end "all ${#HOST_PACKAGES[@]} already installed"
        return
    fi
    vm_log "   installing: ${missing[*]}"
    apt-get -q update
    DEBIAN_FRONTEND=noninteractive apt-get -q install -y --no-install-recommends "${missing[@]}"
    step_end "installed ${#missing[@]}"
}

# Sets KVER (e.g. 6.1.0-56-amd64) and DEBVER (e.g. 6.1.192-2) from apt's candidate linux-image-amd64.
resolve_kernel_version() {
    local candidate dep
    candidate="$(apt-cache policy linux-image-amd64 | awk '/Candidate:/ { print $2 }')"
    if [[ -z "$candidate" || "$candidate" == "(none)" ]]; then
        apt-get -q update
        candidate="$(apt-cache policy linux-image-amd64 | awk '/Candidate:/ { print $2 }')"
    fi
    [[ -n "$candidate" && "$candidate" != "(none)" ]] || vm_die "apt has no candidate for linux-image-amd64"
    # "Depends: linux-image-6.1.0-56-amd64 (= 6.1.192-2)"
    dep="$(apt-cache show "linux-image-amd64=$candidate" |
        sed -n 's/^Depends:.*linux-image-\([0-9][^ ,]*-amd64\) (= \([^)]*\)).*/\1 \2/p' | head -n1)"
    [[ -n "$dep" ]] || vm_die "cannot find the versioned kernel package linux-image-amd64=$candidate depends on"
    read -r KVER DEBVER <<<"$dep"
}

# Unpacks linux-image-$KVER into $RPC_VM_CACHE/kernel (replacing any previous tree).
fetch_kernel_image() {
    step_start "kernel image"
    mkdir -p "$RPC_VM_CACHE/debs"
    (cd "$RPC_VM_CACHE/debs" && apt_download "linux-image-$KVER=$DEBVER")
    rm -rf "$RPC_VM_CACHE/kernel" "$RPC_VM_CACHE/kernel.tmp"
    dpkg-deb -x "$RPC_VM_CACHE/debs/linux-image-${KVER}_${DEBVER}_amd64.deb" "$RPC_VM_CACHE/kernel.tmp"
    mv "$RPC_VM_CACHE/kernel.tmp" "$RPC_VM_CACHE/kernel"
    step_end "linux-image-$KVER $DEBVER"
}

# Prints the version of PACKAGE to download for the kernel $DEBVER: $DEBVER itself when apt has it,
# else the newest one of the same upstream release (6.1.192-2 -> 6.1.192-3). The archive does not
# publish a kernel's packages at once: on 2026-11-28 bookworm-security had linux-image and
# linux-headers at 6.1.192-2 but linux-kbuild only at 6.1.192-3, and siw.ko was not built. The
# kbuild tools and the siw sources of one upstream release build the same module.
version_for_kernel() {
    local pkg="$1" upstream="${DEBVER%-*}-" versions v
    versions="$(apt_versions "$pkg")"
    if [[ -z "$(versions_of_upstream "$upstream" <<<"$versions")" ]]; then
        # Package lists older than the kernel (e.g. a cached kernel on a new machine): update once.
        apt-get -q update >&2
        versions="$(apt_versions "$pkg")"
    fi
    if grep -qxF "$DEBVER" <<<"$versions"; then
        echo "$DEBVER"
        return
    fi
    v="$(versions_of_upstream "$upstream" <<<"$versions" | tail -n1)"
    [[ -n "$v" ]] || vm_die "apt has no $pkg of upstream ${DEBVER%-*} (wanted $DEBVER; has: ${versions//$'\n'/ })"
    vm_log "   $pkg $DEBVER is not in the archive: using $v (same upstream release)"
    echo "$v"
}

# The versions of PKG that apt knows, one a line.
apt_versions() {
    apt-cache madison "$1" | awk -F'|' '{ gsub(/ /, "", $2); print $2 }'
}

# The versions on stdin that begin with PREFIX (an upstream release and its dash), newest last.
versions_of_upstream() {
    awk -v p="$1" 'index($0, p) == 1' | sort -V
}

# Unpacks the headers of exactly $KVER/$DEBVER, and the kbuild tools of its upstream release
# (version_for_kernel), into a scratch dir; prints the kbuild dir.
unpack_kernel_headers() {
    local series="${KVER%%.0-*}" # 6.1.0-56-amd64 -> 6.1
    local common="${KVER%-amd64}-common"
    local scratch="$RPC_VM_CACHE/build/headers" deb kbuild_ver
    kbuild_ver="$(version_for_kernel "linux-kbuild-$series")"
    mkdir -p "$RPC_VM_CACHE/debs"
    (cd "$RPC_VM_CACHE/debs" && apt_download "linux-headers-$KVER=$DEBVER" \
        "linux-headers-$common=$DEBVER" "linux-kbuild-$series=$kbuild_ver") >&2
    rm -rf "$scratch"
    mkdir -p "$scratch"
    for deb in "$RPC_VM_CACHE"/debs/linux-{headers-"$KVER",headers-"$common"}_"$DEBVER"_*.deb \
        "$RPC_VM_CACHE"/debs/linux-kbuild-"$series"_"$kbuild_ver"_*.deb; do
        dpkg-deb -x "$deb" "$scratch"
    done
    local kbuild="$scratch/usr/src/linux-headers-$KVER"
    # The arch Makefile includes the common tree by absolute path (/usr/src/...): point it at the scratch
    # copy. The other links (scripts, tools, include) are relative and already resolve inside scratch.
    sed -i "s|^include /usr/src/|include $scratch/usr/src/|" "$kbuild/Makefile"
    echo "$kbuild"
}

# Extracts drivers/infiniband/sw/siw from linux-source-<series> of $DEBVER's upstream release
# (version_for_kernel); prints the source dir.
extract_siw_source() {
    local series="${KVER%%.0-*}"
    local scratch="$RPC_VM_CACHE/build/src" source_ver
    source_ver="$(version_for_kernel "linux-source-$series")"
    mkdir -p "$RPC_VM_CACHE/debs"
    (cd "$RPC_VM_CACHE/debs" && apt_download "linux-source-$series=$source_ver") >&2
    rm -rf "$scratch"
    mkdir -p "$scratch"
    dpkg-deb --fsys-tarfile "$RPC_VM_CACHE/debs/linux-source-${series}_${source_ver}_all.deb" |
        tar -xO "./usr/src/linux-source-$series.tar.xz" |
        tar -xJ -C "$scratch" --wildcards "linux-source-$series/drivers/infiniband/sw/siw/*"
    echo "$scratch/linux-source-$series/drivers/infiniband/sw/siw"
}

# Builds siw.ko and installs it as updates/siw.ko in the cached module tree.
build_siw() {
    step_start "siw.ko (soft-iWARP, out of tree)"
    local kbuild siwsrc
    kbuild="$(unpack_kernel_headers)"
    siwsrc="$(extract_siw_source)"
    # Debian's .config has CONFIG_RDMA_SIW unset, so the Kbuild file needs it forced to "m".
    make -s -C "$kbuild" M="$siwsrc" CONFIG_RDMA_SIW=m -j"$(nproc)" modules
    local vermagic
    vermagic="$(modinfo -F vermagic "$siwsrc/siw.ko")"
    [[ "$vermagic" == "$KVER "* ]] || vm_die "siw.ko vermagic '$vermagic' does not match $KVER"
    mkdir -p "$VM_MODULES_DIR/updates"
    strip --strip-debug -o "$VM_MODULES_DIR/updates/siw.ko" "$siwsrc/siw.ko"
    step_end "vermagic $vermagic"
}

# Downloads/unpacks the kernel and builds siw.ko unless the cache already has them.
prepare_kernel() {
    if [[ "${RPC_VM_REFRESH:-0}" == 1 ]]; then
        vm_log "RPC_VM_REFRESH=1: discarding the cached kernel and initramfs"
        rm -rf "$RPC_VM_CACHE/kernel" "$RPC_VM_CACHE/kernel.env" "$RPC_VM_CACHE/initramfs".*
    fi
    if [[ -f "$RPC_VM_CACHE/kernel.env" ]]; then
        # shellcheck source=/dev/null
        source "$RPC_VM_CACHE/kernel.env"
        vm_log "== kernel: cached $KVER ($DEBVER); RPC_VM_REFRESH=1 re-resolves it"
    else
        step_start "resolve kernel version"
        resolve_kernel_version
        step_end "linux-image-$KVER $DEBVER"
        fetch_kernel_image
    fi
    VM_MODULES_DIR="$RPC_VM_CACHE/kernel/lib/modules/$KVER"

    if [[ -f "$VM_MODULES_DIR/updates/siw.ko" && -f "$VM_MODULES_DIR/modules.dep" ]]; then
        vm_log "== siw.ko: cached"
        return
    fi
    # A subshell with its own errexit: a failed siw build must not stop the rxe-only harness.
    # ("if ! build_siw" would silently disable errexit inside build_siw.)
    local rc=0
    set +e
    (
        set -e
        build_siw
    )
    rc=$?
    set -e
    ((rc == 0)) ||
        vm_log "!!!!! WARNING: building siw.ko FAILED: the VM will have rxe0 (soft-RoCE) but NO siw0 !!!!!"
    depmod -b "$RPC_VM_CACHE/kernel" "$KVER"
    printf 'KVER=%q\nDEBVER=%q\n' "$KVER" "$DEBVER" >"$RPC_VM_CACHE/kernel.env"
}

# Copies a module into the initramfs staging dir, decompressing it if needed.
copy_module() {
    local src="$1" dest_dir="$2" name
    name="$(basename "$src")"
    case "$name" in
    *.ko) cp "$src" "$dest_dir/$name" ;;
    *.ko.xz) xz -dc "$src" >"$dest_dir/${name%.xz}" ;;
    *.ko.gz) gzip -dc "$src" >"$dest_dir/${name%.gz}" ;;
    *) vm_die "unsupported module format: $src" ;;
    esac
    echo "${name%%.ko*}"
}

build_initramfs() {
    local init_src="$VM_SCRIPTS_DIR/initramfs-init"
    local stamp
    stamp="$(cat "$init_src" /bin/busybox <(echo "$KVER ${INITRAMFS_MODULES[*]}") | sha256sum | cut -c1-16)"
    if [[ -f "$RPC_VM_CACHE/initramfs.cpio.gz" && "$(cat "$RPC_VM_CACHE/initramfs.stamp" 2>/dev/null)" == "$stamp" ]]; then
        vm_log "== initramfs: cached"
        return
    fi
    step_start "initramfs"
    local root="$RPC_VM_CACHE/build/initramfs"
    rm -rf "$root"
    mkdir -p "$root"/{bin,dev,proc,sys,lower,ovl,newroot,modules}
    cp /bin/busybox "$root/bin/busybox"
    install -m 0755 "$init_src" "$root/init"
    # The kernel opens /dev/console before init runs; init re-opens it after mounting devtmpfs anyway.
    mknod -m 600 "$root/dev/console" c 5 1 2>/dev/null || true

    # Resolve dependencies in load order and de-duplicate (virtio_ring etc. are shared).
    local ko seen=" "
    while read -r ko; do
        [[ "$seen" == *" $ko "* ]] && continue
        seen+="$ko "
        copy_module "$ko" "$root/modules" >>"$root/modules/order"
    done < <(for m in "${INITRAMFS_MODULES[@]}"; do
        modprobe -d "$RPC_VM_CACHE/kernel" -S "$KVER" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
    done)

    (cd "$root" && find . -print0 | cpio --null -o -H newc --owner=0:0 --quiet) |
        gzip -1 >"$RPC_VM_CACHE/initramfs.cpio.gz.tmp"
    mv "$RPC_VM_CACHE/initramfs.cpio.gz.tmp" "$RPC_VM_CACHE/initramfs.cpio.gz"
    echo "$stamp" >"$RPC_VM_CACHE/initramfs.stamp"
    step_end "modules: $(tr '\n' ' ' <"$root/modules/order")"
}

main() {
    [[ "$(id -u)" == 0 ]] || vm_die "must run as root (apt-get, mknod)"
    local t0
    t0="$(vm_now)"
    mkdir -p "$RPC_VM_CACHE/out"
    vm_log "cache: $RPC_VM_CACHE"
    install_host_packages
    prepare_kernel
    build_initramfs
    # Scratch space is only needed while building; a warm cache never needs it again.
    rm -rf "$RPC_VM_CACHE/build" "$RPC_VM_CACHE/debs"
    vm_log "ready: kernel $KVER ($DEBVER), siw.ko $([[ -f "$VM_MODULES_DIR/updates/siw.ko" ]] && echo present || echo MISSING)"
    vm_log "setup total: $(vm_elapsed "$t0" "$(vm_now)") s"
}

main "$@"
