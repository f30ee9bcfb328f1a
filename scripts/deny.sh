#!/usr/bin/env bash
# cargo-deny over the workspace and over fuzz/ (its own workspace): licenses, bans, sources, then
# advisories. Policy: deny.toml and fuzz/deny.toml.
#
#   scripts/deny.sh
#
# 1. Installs cargo-deny $CARGO_DENY_VERSION with `cargo install --locked` when it is missing or
#    another version (about 9 minutes on the 2-core build machine; the time is printed).
# 2. `cargo deny --locked check licenses bans sources` for both workspaces: any error fails.
# 3. `cargo deny check advisories` for both: needs the RustSec advisory database, a git clone from
#    GitHub. When it cannot be fetched (no network to GitHub), a loud banner says the advisory check
#    did NOT run and why, and the script does not fail for it; an advisory found fails.
#
# Findings are printed without their inclusion graphs; `cargo deny check <which>` shows them.
#
# Exit status: 0 all checks that ran passed; 1 a check failed (or cargo-deny could not be installed).
set -euo pipefail
cd "$(dirname "$0")/.."

# 0.20.2 needs rustc >= 1.88 (we build with 1.95).
CARGO_DENY_VERSION=0.20.2
MANIFESTS=(Cargo.toml fuzz/Cargo.toml)

say() { printf '[deny.sh] %s\n' "$*" >&2; }

banner() {
    printf '\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n' >&2
    local line
    for line in "$@"; do
        printf '!!! %s\n' "$line" >&2
    done
    printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\n' >&2
}

ensure_cargo_deny() {
    local have
    have="$(cargo deny --version 2>/dev/null | awk '{print $2}' || true)"
    if [[ "$have" == "$CARGO_DENY_VERSION" ]]; then
        say "cargo-deny $have already installed"
        return
    fi
    say "installing cargo-deny $CARGO_DENY_VERSION (found: ${have:-none}): cargo install --locked"
    local t0=$SECONDS
    if ! cargo install --locked cargo-deny --version "$CARGO_DENY_VERSION"; then
        say "ERROR: cargo install cargo-deny $CARGO_DENY_VERSION failed"
        exit 1
    fi
    say "installed cargo-deny $CARGO_DENY_VERSION in $((SECONDS - t0)) s"
}

check_policy() {
    local failed=0 manifest
    for manifest in "${MANIFESTS[@]}"; do
        say "cargo deny --locked --manifest-path $manifest check licenses bans sources"
        cargo deny --locked --manifest-path "$manifest" check --hide-inclusion-graph licenses bans sources || failed=1
    done
    return "$failed"
}

# Advisories: a database that cannot be fetched is announced, not failed; a finding fails.
check_advisories() {
    local log reason manifest status failed=0
    log="$(mktemp)"
    say "cargo deny fetch db (the RustSec advisory database)"
    if ! cargo deny fetch db >"$log" 2>&1; then
        if grep -q 'failed to validate configuration' "$log"; then
            cat "$log" >&2
            say "ERROR: deny.toml is invalid (above)"
            rm -f "$log"
            return 1
        fi
        reason="$(grep -m1 -E 'fatal:|error:|Could not' "$log" || grep -m1 ERROR "$log" || tail -n 1 "$log")"
        banner "THE ADVISORY CHECK DID NOT RUN: the advisory database could not be fetched." \
            "Why: ${reason:0:200}" \
            "Licenses, bans and sources were checked; known vulnerabilities were NOT." \
            "Run scripts/deny.sh where GitHub is reachable to check them."
        rm -f "$log"
        return 0
    fi
    for manifest in "${MANIFESTS[@]}"; do
        say "cargo deny --locked --manifest-path $manifest check advisories"
        status=0
        cargo deny --locked --manifest-path "$manifest" check --hide-inclusion-graph advisories >"$log" 2>&1 ||
            status=$?
        cat "$log" >&2
        if ((status == 0)); then
            continue
        fi
        if grep -q 'failed to fetch advisory database' "$log"; then
            banner "THE ADVISORY CHECK DID NOT RUN for $manifest: the database fetch failed midway."
        else
            say "ERROR: advisories found for $manifest (above)"
            failed=1
        fi
    done
    rm -f "$log"
    return "$failed"
}

main() {
    ensure_cargo_deny
    local status=0
    check_policy || status=1
    check_advisories || status=1
    if ((status != 0)); then
        say "cargo-deny FAILED"
        exit 1
    fi
    say "cargo-deny passed"
}

main "$@"
