#!/usr/bin/env bash
# PGO training inside the VM (scripts/pgo.sh --vm runs it through run.sh): rpc-core echo of 32 B to
# 1 MiB over rxe0 and then over siw0 (rxe0 removed first, as the suite does), busy-polling and
# event-driven, with an instrumented rpc-bench whose profiles go to PROFILE_DIR.
#
#   scripts/vm/pgo-train.sh BIN PROFILE_DIR
set -euo pipefail

bin="${1:?usage: pgo-train.sh BIN PROFILE_DIR}"
export LLVM_PROFILE_FILE="${2:?usage: pgo-train.sh BIN PROFILE_DIR}/vm-%p-%m.profraw"
out="${RPC_VM_OUT:-/tmp}/pgo"
for dev in rxe0 siw0; do
    if [[ "$dev" == siw0 ]]; then
        rdma link delete rxe0
    fi
    for busy in 0 2000; do
        echo "pgo training: $dev, busy-poll $busy us"
        RPC_RDMA_DEVICE="$dev" "$bin" run --listen rdma://10.0.2.15:0 --workload echo --sizes 32,4K,1M \
            --duration 2 --busy-poll-us "$busy" --no-plots --out "$out"
    done
done
