"""kvtrim.Daemon: a private kvtrimd for a notebook or a test, on a
temporary runtime directory, stopped (SIGTERM, then SIGKILL after a grace
period) on stop(), on leaving its `with` block, and at interpreter exit."""
import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))


def daemon_path():
    """The kvtrimd this package carries (setup.py copies it in), else
    $KVTRIM_BIN_DIR/kvtrimd, else kvtrimd on PATH."""
    for p in (os.path.join(_HERE, "bin", "kvtrimd"),
              os.path.join(os.environ.get("KVTRIM_BIN_DIR", ""), "kvtrimd")):
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    p = shutil.which("kvtrimd")
    if not p:
        raise FileNotFoundError("no kvtrimd: neither in the kvtrim package, "
                                "nor in $KVTRIM_BIN_DIR, nor on PATH")
    return p


class Daemon:
    """Starts kvtrimd --runtime-dir <tmp> --backend <backend> --pool-size
    <pool_size> [args...]; .runtime_dir is what Client(runtime_dir=...)
    takes, .log the path of its stderr.  Raises RuntimeError with the log
    when it does not come up within timeout seconds."""

    def __init__(self, pool_size="256M", backend="cpu", args=(),
                 timeout=10.0, binary=None):
        self.runtime_dir = tempfile.mkdtemp(prefix="kvtrim-")
        self.log = os.path.join(self.runtime_dir, "kvtrimd.log")
        cmd = [binary or daemon_path(), "--runtime-dir", self.runtime_dir,
               "--backend", backend, "--pool-size", str(pool_size),
               *map(str, args)]
        self._logf = open(self.log, "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                     stdout=self._logf, stderr=self._logf)
        atexit.register(self.stop)
        ctl = os.path.join(self.runtime_dir, "ctl.ipc")
        fd = os.path.join(self.runtime_dir, "fd.sock")
        t0 = time.monotonic()
        while not (os.path.exists(ctl) and os.path.exists(fd)):
            if self.proc.poll() is not None or \
                    time.monotonic() - t0 > timeout:
                self.stop()
                raise RuntimeError(f"kvtrimd did not start: {cmd}\n"
                                   f"{self._read_log()}")
            time.sleep(0.01)

    def _read_log(self):
        try:
            with open(self.log, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace=5.0):
        """SIGTERM (kvtrimd drains and exits 0), SIGKILL after grace
        seconds; removes the runtime directory.  Returns the exit status
        (None when it was stopped already)."""
        if self.proc is None:
            return None
        rc = self.proc.poll()
        if rc is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait()
        self.proc = None
        self._logf.close()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
        atexit.unregister(self.stop)
        return rc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def __repr__(self):
        return (f"<kvtrim.Daemon {self.runtime_dir} "
                f"{'running' if self.running else 'stopped'}>")
