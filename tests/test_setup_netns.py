"""Offline from the first cell, native code included: the default path runs in a Linux network namespace that has
only loopback, and the kernel's own counters say whether anything tried to leave.

tests/offline/sitecustomize.py refuses connections made through Python's socket module; libzmq, hf_xet, a Rust or C
library would not pass through it. In a namespace with loopback alone every other address has no route, and the
kernel counts each attempt, whoever makes it: a TCP connect or a UDP send to an outside address adds one to
Ip:OutNoRoutes (Ip6OutNoRoutes for IPv6), and a datagram to a loopback port with nothing behind it (a DNS query to
a local stub resolver) to Udp:NoPorts. Here the guard is off, so Python-level attempts are counted too.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GUARD = REPO / "tests" / "offline"
NOTEBOOKS = ["notebooks/01_one_second.ipynb", "notebooks/zh/02_tokenization.ipynb"]   # the first cell; 中文
ATTEMPTS = ["Ip:OutNoRoutes", "Ip6OutNoRoutes", "Udp:NoPorts", "Udp6NoPorts"]

# Runs inside the namespace: loopback up (it starts down), the counters read, the default path, the counters again.
INSIDE = """import fcntl, json, socket, struct, subprocess, sys
IFF_UP, IFF_LOOPBACK, IFF_RUNNING, SIOCSIFFLAGS = 0x1, 0x8, 0x40, 0x8914
fcntl.ioctl(socket.socket(), SIOCSIFFLAGS, struct.pack("16sH", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING))

def counters():
    out = {}
    lines = open("/proc/net/snmp").read().splitlines()
    for names, values in zip(lines[::2], lines[1::2]):
        group = names.split()[0]
        out.update({group + n: int(v) for n, v in zip(names.split()[1:], values.split()[1:])})
    out.update({n: int(v) for n, v in (line.split() for line in open("/proc/net/snmp6"))})
    return out

interfaces = sorted(n for _, n in socket.if_nameindex())
before = counters()
import llmwalk as lw
print(lw.load_model(progress=False), flush=True)
nbval = subprocess.run([sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env", "--nbval-sanitize-with",
                        "notebooks/sanitize.cfg", *sys.argv[1:], "-q", "-p", "no:cacheprovider", "-n", "0"])
after = counters()
print(json.dumps({"interfaces": interfaces, "nbval": nbval.returncode,
                  "attempts": {k: after.get(k, 0) - before.get(k, 0) for k in %r}}))
""" % (ATTEMPTS,)


def namespace_command() -> list[str] | None:
    """`unshare -n` as root, `unshare -rn` (an unprivileged user namespace) otherwise; None if neither works here."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return None
    tries = [["unshare", "-n"], ["unshare", "-rn"]] if os.geteuid() == 0 else [["unshare", "-rn"]]
    return next((t for t in tries if subprocess.run(t + ["true"], capture_output=True).returncode == 0), None)


def test_the_default_path_runs_with_no_route_out_and_tries_none():
    unshare = namespace_command()
    if unshare is None:
        reason = ("no network namespace here (needs Linux with `unshare -n` as root or unprivileged user namespaces for "
                  "`unshare -rn`), so native libraries' sockets go unchecked")
        if os.environ.get("CI") == "true":
            pytest.fail(reason + ": CI runs as root on Linux and must check them")
        pytest.skip(reason)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "LLMWALK_TEST_OFFLINE")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                        if p and Path(p).resolve() != GUARD)      # the namespace is the guard here
    env["OMP_NUM_THREADS"] = "1"
    out = subprocess.run(unshare + [sys.executable, "-c", INSIDE, *NOTEBOOKS], cwd=REPO, env=env,
                         capture_output=True, text=True, encoding="utf-8", timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["interfaces"] == ["lo"]                          # nothing but loopback: there is no way out
    assert result["nbval"] == 0, out.stdout[-3000:]
    assert result["attempts"] == dict.fromkeys(ATTEMPTS, 0), f"something tried to leave this machine: {result['attempts']}"
