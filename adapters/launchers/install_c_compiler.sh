#!/usr/bin/env bash
# Installs a C compiler (Debian's gcc) so that setup.py can compile the simulator's event loop
# with mypyc. Without one the package still installs, with the loop as pure Python (slower).
set -euo pipefail
python=${1:-python3}
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc)
include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
# Debian's own Python keeps its C headers in python3-dev
if [ ! -e "$include/Python.h" ] && [[ "$include" == /usr/include/* ]]; then need+=(python3-dev); fi
[ ${#need[@]} -eq 0 ] && exit 0
if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || command -v sudo >/dev/null 2>&1; }; then
    if [ "$(id -u)" = 0 ]; then apt_get="apt-get"; else apt_get="sudo apt-get"; fi
    echo "installing ${need[*]} for the simulator's compiled event loop" >&2
    { $apt_get update -qq && DEBIAN_FRONTEND=noninteractive $apt_get install -y -qq "${need[@]}"; } \
        >&2 || echo "note: ${need[*]} could not be installed; the simulator's loop runs as pure Python" >&2
else
    echo "note: no C compiler; the simulator's loop runs as pure Python (install gcc for speed)" >&2
fi
