# A class on one server: JupyterHub for llmwalk (see README.md, "Teaching a class").
#
#     sudo /srv/llmwalk/.venv/bin/jupyterhub -f /srv/llmwalk/classroom/hub/jupyterhub_config.py
#
# What every student gets: a JupyterLab server started from this checkout's .venv (so the `llmwalk` kernel), the
# notebooks of both editions copied into ~/llmwalk on first login (files added to the series later are copied at the
# next start; a student's own edits are never overwritten), the model cache the teacher converted once, read-only,
# shared by everyone (the weights are memory-mapped: one copy in RAM for the whole class), a memory limit, and an idle
# culler that stops servers nobody has used for an hour.
#
# What a teacher changes for a real class, all below: the authenticator (PAM, the school's OAuth/LDAP: here the
# server's own accounts), the memory limit (MEM_LIMIT, from the measurement in README.md), and the spawner's
# options. tests/test_hub.py runs this file with two replacements only: a test authenticator (DummyAuthenticator)
# and a spawner that runs every student as the current user (SimpleLocalProcessSpawner, which enforces no limit).
import os
import pwd
import shutil
import sys
from pathlib import Path

c = get_config()  # noqa: F821 (JupyterHub's config loader defines it)

REPO = Path(os.environ.get("LLMWALK_REPO", Path(__file__).resolve().parents[2]))   # the llmwalk checkout
VENV_BIN = Path(sys.executable).parent          # the hub runs from the venv the students' servers run from
# Converted once by the teacher (README: `LLMWALK_CACHE=/srv/llmwalk-cache .venv/bin/python -c "import llmwalk as lw;
# lw.load_model(); lw.load_model('gemma3-270m')"`, then `chmod -R a+rX,a-w /srv/llmwalk-cache`); llmwalk reads a
# complete cache without writing to it.
CACHE = os.environ.get("LLMWALK_CACHE", "/srv/llmwalk-cache")
# Per student: a JupyterLab server (~140 MB PSS) and a kernel per open notebook; a class kernel that ran 04 (SmolLM2
# and Gemma-3, traces included) holds ~380 MB of its own, ~250 MB with SmolLM2 only, and ~200 / ~65 MB where KSM
# merges what the kernels hold alike (README.md, "Memory per student"); the weights are shared. 1.5 GB: a server and
# two notebooks' kernels, without counting on KSM (a merged page stays charged to the cgroup of the kernel that had
# it first). Enforced by SystemdSpawner (cgroup MemoryMax).
MEM_LIMIT = os.environ.get("LLMWALK_MEM_LIMIT", "1.5G")
STATE = Path(os.environ.get("LLMWALK_HUB_STATE", "/srv/llmwalk-hub"))   # the hub's database, secret, kernel spec
NOTEBOOKS = REPO / "notebooks"
HANDED_OUT = "llmwalk"                          # the folder in each student's home


# ---------------------------------------------------------------- who logs in
# The server's own Unix accounts (PAM, JupyterHub's default). A school's single sign-on: e.g.
# oauthenticator.GenericOAuthenticator or ldapauthenticator.LDAPAuthenticator, plus c.LocalAuthenticator.create_system_users.
c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allow_all = True                # every account of the server; a class list: c.Authenticator.allowed_users
c.Authenticator.admin_users = set()             # e.g. {"teacher"}

# ---------------------------------------------------------------- how a student's server runs
# SystemdSpawner (pip install jupyterhub-systemdspawner; The Littlest JupyterHub uses it) runs each student's server
# as that student in a systemd unit whose cgroup enforces mem_limit (MemoryMax) and cpu_limit.
c.JupyterHub.spawner_class = "systemdspawner.SystemdSpawner"
c.Spawner.mem_limit = MEM_LIMIT
c.Spawner.cpu_limit = 1.0                       # a class shares the cores; a loaded kernel waits, it does not fail
c.SystemdSpawner.isolate_tmp = True
c.SystemdSpawner.disable_user_sudo = True
c.Spawner.cmd = [str(VENV_BIN / "jupyterhub-singleuser")]   # the venv's server: its `llmwalk` kernel, its packages
c.Spawner.default_url = f"/lab/tree/{HANDED_OUT}"
c.Spawner.notebook_dir = "~"
c.Spawner.environment = {
    "LLMWALK_CACHE": CACHE,
    # One torch thread per kernel: thirty kernels with a thread per core each would fight over the same cores.
    "OMP_NUM_THREADS": "1",
}
# The students' kernel (llmwalk/class_kernel.py), under the name the notebooks ask for: the venv's Python started with
# its address-space layout fixed and llmwalk.classroom loaded as an IPython extension, which keeps no Out[n] cache of
# every figure, gives a cell's freed heap back to the OS, and lets the Linux kernel merge the pages every student's
# kernel holds alike (the imports, the model's tokenizer: README "Memory per student"). Written at each hub start;
# JUPYTER_PATH finds it before the venv's own spec.
from llmwalk.class_kernel import KSM, ksm_available, write_spec  # noqa: E402 (the hub runs from the venv)

write_spec(STATE / "jupyter", str(VENV_BIN / "python"))
# KSM (kernel samepage merging) stores a page that many kernels hold alike once. Switched on here when the hub runs
# as root on Linux; LLMWALK_KSM=0 leaves the server's setting alone. Its trade-off: the ksmd thread scans memory
# (pages_to_scan pages every 20 ms; 2 % of one core measured, README), and a process can tell by timing whether
# another holds a page identical to one it writes — for a class's kernels running the same notebooks, nothing worth
# hiding.
if os.environ.get("LLMWALK_KSM", "1") != "0" and ksm_available():
    (KSM / "pages_to_scan").write_text(os.environ.get("LLMWALK_KSM_PAGES_TO_SCAN", "1000"))
    (KSM / "run").write_text("1")
c.Spawner.environment["JUPYTER_PATH"] = str(STATE / "jupyter")
# Kernels talk to their server over Unix sockets (ZeroMQ's ipc transport), not over TCP ports on 127.0.0.1. Each
# student's server picks its kernels' ports on its own, so two kernels started at the same moment can be handed the
# same port; the one that loses cannot bind it, and jupyter_client restarts it on the same ports until it gives up
# (tests/test_hub.py saw a student's kernel die so). A socket's path must stay under ~107 bytes, so the sockets live in
# a short folder of the student's own in /tmp (private to the student: SystemdSpawner's isolate_tmp), not under a home
# folder of any length.
c.Spawner.args = ["--KernelManager.transport=ipc"]
c.Spawner.environment["JUPYTER_RUNTIME_DIR"] = lambda spawner: f"/tmp/llmwalk-{spawner.user.name}"
c.Spawner.http_timeout = 120                    # a first start on a busy server imports JupyterLab slowly
c.Spawner.start_timeout = 120


def student_home(spawner) -> Path:
    """The student's home: the spawner's own (SimpleLocalProcessSpawner.home_dir), else the Unix account's."""
    return Path(getattr(spawner, "home_dir", "") or pwd.getpwnam(spawner.user.name).pw_dir)


def hand_out_notebooks(spawner) -> None:
    """Copy the notebooks (both editions) into ~/llmwalk: the files the student does not have yet, none overwritten.

    Runs in the hub before each start; the copies belong to the student when the hub runs as root.
    """
    home = student_home(spawner)
    target = home / HANDED_OUT
    try:
        owner = pwd.getpwnam(spawner.user.name)
    except KeyError:                            # a test user with no Unix account: files stay the hub's user's
        owner = None
    for source in sorted(NOTEBOOKS.rglob("*")):
        if ".ipynb_checkpoints" in source.parts or source.name == "__pycache__":
            continue
        copy = target / source.relative_to(NOTEBOOKS)
        if source.is_dir():
            copy.mkdir(parents=True, exist_ok=True)
        elif not copy.exists():
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy)
        else:
            continue
        if owner is not None and os.getuid() == 0:
            os.chown(copy, owner.pw_uid, owner.pw_gid)
    if owner is not None and os.getuid() == 0:
        os.chown(target, owner.pw_uid, owner.pw_gid)


c.Spawner.pre_spawn_hook = hand_out_notebooks

# ---------------------------------------------------------------- the idle culler
# Stops a server after an hour without activity (a closed browser tab leaves its kernels running): its memory
# returns to the class. The student's files stay; the next login starts a fresh server.
c.JupyterHub.services = [{
    "name": "idle-culler",
    "command": [sys.executable, "-m", "jupyterhub_idle_culler", "--timeout=3600", "--cull-every=300"],
}]
c.JupyterHub.load_roles = [{
    "name": "idle-culler",
    "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
    "services": ["idle-culler"],
}]

# ---------------------------------------------------------------- the hub itself
# Behind the school's HTTPS (or c.JupyterHub.ssl_cert / ssl_key here). The proxy is configurable-http-proxy from npm.
c.JupyterHub.bind_url = os.environ.get("LLMWALK_HUB_URL", "http://:8000")
c.ConfigurableHTTPProxy.command = [shutil.which("configurable-http-proxy")
                                   or str(VENV_BIN.parent / "node_modules" / ".bin" / "configurable-http-proxy")]
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
