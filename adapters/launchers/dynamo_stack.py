"""Runs a local NVIDIA Dynamo deployment as one process group: an event-plane broker, the
frontend and the workers, for harness.adapters.launchers.dynamo_server.

Run with the Dynamo virtualenv's python (it has pyzmq):

    python dynamo_stack.py SPEC.json

SPEC: {"broker": [XSUB_PORT, XPUB_PORT], "processes": [{"name", "cmd", "env", "log"}, ...]}.

The broker is a ZMQ XSUB/XPUB forwarder bound to 127.0.0.1 (Dynamo's publishers then connect
to it instead of binding sockets of their own on 0.0.0.0, which no setting of 1.6 changes). The
processes start in the order given, in this process's group, each writing its own log. When one
of them exits the others are stopped and this script exits with its code, having printed the
tail of its log; SIGTERM or SIGINT stops them all (SIGTERM, then SIGKILL after 10 s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

STOP_WAIT_S = 10.0


def _broker(xsub_port: int, xpub_port: int, ready: threading.Event) -> None:
    import zmq

    ctx = zmq.Context()
    xsub = ctx.socket(zmq.XSUB)
    xsub.bind(f"tcp://127.0.0.1:{xsub_port}")
    xpub = ctx.socket(zmq.XPUB)
    xpub.bind(f"tcp://127.0.0.1:{xpub_port}")
    ready.set()
    zmq.proxy(xsub, xpub)


def _tail(path: str, n: int = 12) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _stop(children: list[subprocess.Popen[bytes]]) -> None:
    for c in children:
        if c.poll() is None:
            c.terminate()
    deadline = time.monotonic() + STOP_WAIT_S
    for c in children:
        try:
            c.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.kill()
            c.wait()


def main(argv: list[str]) -> int:
    spec: dict[str, Any] = json.loads(Path(argv[0]).read_text())
    ready = threading.Event()
    threading.Thread(target=_broker, args=(*spec["broker"], ready), daemon=True).start()
    if not ready.wait(10.0):
        print("the event-plane broker did not start", flush=True)
        return 1
    stopping = threading.Event()

    def on_signal(signum: int, _: Any) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    children: list[subprocess.Popen[bytes]] = []
    names: list[tuple[str, str]] = []
    try:
        for p in spec["processes"]:
            with open(p["log"], "wb") as out:
                children.append(subprocess.Popen(
                    p["cmd"], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env={**os.environ, **p["env"]}))
            names.append((p["name"], p["log"]))
            print(f"started {p['name']} (pid {children[-1].pid})", flush=True)
        while not stopping.is_set():
            for child, (name, log) in zip(children, names, strict=True):
                code = child.poll()
                if code is not None:
                    print(f"{name} exited with code {code}; its log ends:\n{_tail(log)}",
                          flush=True)
                    return code or 1
            stopping.wait(0.2)
        return 0
    finally:
        _stop(children)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
