"""Real engines the remote-launcher tests start themselves (issue 19): a single-node Slurm
cluster (Debian 12's slurmctld, slurmd, slurm-client and munge) and an sshd on loopback.

Both need root (munged runs as the munge user; slurmd and sshd start jobs and sessions as the
submitting user), as CI and the developers' machines are.  A fixture that cannot start its
engine raises EngineUnavailable with the reason: the tests fail with it, never skip.
"""

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path


class EngineUnavailable(RuntimeError):
    pass


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(pred, timeout, what, log=None):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = pred()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - reported below
            last = exc
        time.sleep(0.2)
    tail = ""
    if log and Path(log).exists():
        tail = "\n" + "\n".join(Path(log).read_text(errors="replace").splitlines()[-20:])
    raise EngineUnavailable(f"{what} within {timeout} s (last: {last!r}){tail}")


def _need(*commands):
    missing = [c for c in commands if not shutil.which(c) and not Path(c).exists()]
    if missing:
        raise EngineUnavailable(f"not installed: {', '.join(missing)} (scripts/bootstrap.sh "
                                "installs slurmctld, slurmd, slurm-client, munge and openssh-server)")
    if os.geteuid() != 0:
        raise EngineUnavailable("needs root (munged, slurmd and sshd start processes as other users)")


def ensure_munge():
    """Starts munged as the munge user unless one answers already (one per machine: the
    socket is /run/munge/munge.socket.2)."""
    _need("/usr/sbin/munged", "munge", "unmunge")

    def answers():
        p = subprocess.run("munge -n | unmunge", shell=True, capture_output=True, text=True,
                           timeout=10)
        return p.returncode == 0 and "Success" in p.stdout

    if answers():
        return
    for d in ("/run/munge", "/var/log/munge", "/var/lib/munge", "/etc/munge"):
        os.makedirs(d, exist_ok=True)
        shutil.chown(d, "munge", "munge")
    key = Path("/etc/munge/munge.key")
    if not key.exists() or key.stat().st_size == 0:
        subprocess.run(["dd", "if=/dev/urandom", f"of={key}", "bs=1", "count=1024"],
                       check=True, capture_output=True)
    shutil.chown(key, "munge", "munge")
    key.chmod(0o400)
    p = subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged --force"],
                       capture_output=True, text=True, timeout=20)
    if p.returncode != 0:
        raise EngineUnavailable(f"munged did not start: {p.stderr.strip() or p.stdout.strip()}")
    _wait(answers, 10, "munge -n | unmunge did not say Success")


class SlurmCluster:
    """slurmctld + slurmd on this machine, one node (this host's short name) in one partition
    `debug`, everything under `root`.  `env` has SLURM_CONF for the clients.  `cpus` beyond the
    machine's own are declared with SlurmdParameters=config_overrides (a benchmark's 20 jobs at
    once on 2 cores)."""

    def __init__(self, root, cpus=None):
        _need("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "sbatch", "squeue", "scancel", "sinfo")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        self.node = socket.gethostname().split(".")[0]
        self.cpus = cpus or os.cpu_count() or 2
        self.ctld_port = _free_port()
        self.d_port = _free_port()
        self.conf = self.root / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.procs = []

    def _write_conf(self):
        r = self.root
        for d in ("state", "spool", "log"):
            (r / d).mkdir(exist_ok=True)
        self.conf.write_text(f"""\
ClusterName=kgatetest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmdPort={self.d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=2
KillWait=5
OverTimeLimit=0
SchedulerParameters=sched_interval=1,bf_interval=1
{"SlurmdParameters=config_overrides" if self.cpus > (os.cpu_count() or 1) else ""}
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
""")
        (r / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")

    def start(self):
        ensure_munge()
        self._write_conf()
        # By path: root's PATH need not hold /usr/sbin (a CI runner's environment).
        for argv, log in ((["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld.out"),
                          (["/usr/sbin/slurmd", "-D", "-f", str(self.conf)], "slurmd.out")):
            out = open(self.root / "log" / log, "wb")
            self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                               env=self.env, start_new_session=True))
            if argv[0].endswith("slurmctld"):
                _wait(lambda: self.run("sinfo", "-h").returncode == 0, 30,
                      "slurmctld did not answer sinfo", self.root / "log" / "slurmctld.log")

        def node_idle():
            out = self.run("sinfo", "-h", "-N", "-o", "%T").stdout.strip()
            for p in self.procs:
                if p.poll() is not None:
                    raise EngineUnavailable(f"{p.args[0]} exited with {p.returncode}")
            return out.startswith("idle")
        _wait(node_idle, 60, "the node did not become idle", self.root / "log" / "slurmd.log")
        return self

    def run(self, *argv, timeout=30):
        return subprocess.run(list(argv), capture_output=True, text=True, env=self.env,
                              timeout=timeout)

    def jobs(self):
        """squeue's job ids (all states still listed)."""
        out = self.run("squeue", "-h", "-o", "%i").stdout.split()
        return out

    def stop(self):
        try:
            jobs = self.jobs()
            if jobs:
                self.run("scancel", "--full", *jobs)
        except (subprocess.TimeoutExpired, OSError):
            pass  # the controller is gone already: its daemons are stopped below anyway
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.procs = []


class Sshd:
    """An sshd on 127.0.0.1:<free port> with a generated host key, accepting one generated
    user key for this user.  `ssh_options()` are the client options a launcher would get:
    the identity, the port, and a known_hosts file holding exactly this host key
    (StrictHostKeyChecking=yes), so nothing is disabled."""

    def __init__(self, root):
        _need("/usr/sbin/sshd", "ssh", "ssh-keygen")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        self.port = _free_port()
        self.host_key = self.root / "host_ed25519"
        self.user_key = self.root / "id_ed25519"
        self.known_hosts = self.root / "known_hosts"
        self.proc = None

    def start(self):
        for key in (self.host_key, self.user_key):
            if not key.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                               check=True, capture_output=True)
        (self.root / "authorized_keys").write_text(Path(f"{self.user_key}.pub").read_text())
        os.chmod(self.root / "authorized_keys", 0o600)
        host_pub = Path(f"{self.host_key}.pub").read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {host_pub[0]} {host_pub[1]}\n")
        conf = self.root / "sshd_config"
        conf.write_text(f"""\
ListenAddress 127.0.0.1:{self.port}
HostKey {self.host_key}
PidFile {self.root}/sshd.pid
AuthorizedKeysFile {self.root}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowTcpForwarding yes
ClientAliveInterval 5
ClientAliveCountMax 2
""")
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        log = open(self.root / "sshd.log", "wb")
        self.proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(conf)],
                                     stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

        def answers():
            if self.proc.poll() is not None:
                raise EngineUnavailable(f"sshd exited with {self.proc.returncode}")
            return self.ssh("true").returncode == 0
        _wait(answers, 20, "ssh to the test sshd did not work", self.root / "sshd.log")
        return self

    def ssh_options(self):
        return ["-p", str(self.port), "-i", str(self.user_key), "-o", "IdentitiesOnly=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                "-o", "BatchMode=yes"]

    def ssh(self, *command, timeout=20):
        return subprocess.run(["ssh", *self.ssh_options(), "127.0.0.1", *command],
                              capture_output=True, text=True, timeout=timeout)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
