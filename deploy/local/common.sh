# Sourced by the deploy/local scripts: how they speak, stop, and run a command as root.
# SCRIPT names the script in its messages (set it before sourcing).

say() { printf '%s: %s\n' "${SCRIPT:-pkgq}" "$*" >&2; }
die() { say "$*"; exit 1; }

# Run "$@" as root: directly when root, else with password-less sudo; fails otherwise.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; return; fi
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo "$@"; return; fi
    return 1
}
