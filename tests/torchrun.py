"""The torchrun command the tests start their CPU process groups with."""
import socket
import sys


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(nproc: int) -> list:
    """``python -m torch.distributed.run`` for ``nproc`` processes, rendezvous on a free port.

    torchrun's default port (29500) is one for the whole machine: two launches at once (tests in
    two pytest-xdist workers) would meet on it, and one fails or joins the other's group."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-port", str(free_port())]
