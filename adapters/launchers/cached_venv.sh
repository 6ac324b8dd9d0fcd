# Sourced by install_vllm.sh, install_sglang.sh and install_dynamo.sh: a runtime's own virtualenv
# in the harness's cache (outside the clone, apart from the harness's .venv), keyed by what the
# caller names plus the Python version and the machine, a lock that serialises concurrent
# installers, and pip's output without this machine's noise.

CACHE_ROOT="${HARNESS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agent-pause-harness}"

# cached_venv FOLDER KEY: sets `dest` ($CACHE_ROOT/FOLDER/KEY-pyXY-<machine>) and `python` (its
# interpreter), for the interpreter $PY, then holds the lock on it (file descriptor 9) until the
# installer exits.
cached_venv() {
    local py_tag
    py_tag=$("$PY" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')
    dest="$CACHE_ROOT/$1/$2-${py_tag}-$(uname -m)"
    python="$dest/bin/python"
    mkdir -p "$CACHE_ROOT/$1"
    exec 9>"$dest.lock"
    flock 9
}

# reuse_if_ready CHECK...: a finished install (its `.complete` stamp) whose CHECK command passes
# is used as it is: its python printed, the installer done.
reuse_if_ready() {
    if [ -f "$dest/.complete" ] && "$@" >/dev/null 2>&1; then
        echo "$python"
        exit 0
    fi
}

# quiet CMD...: run CMD with pip's warning for each of this machine's empty local package
# index folders left out of its error output (one line per package: not news).
quiet() { "$@" 2> >(grep -v -e '^WARNING: Location' -e 'is ignored: it is neither a file nor a directory' >&2); }
