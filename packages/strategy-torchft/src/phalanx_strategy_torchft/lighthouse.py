"""Run a torchft lighthouse: ``python -m phalanx_strategy_torchft.lighthouse --min-replicas 1``.

The lighthouse is the one process every replica group asks for a quorum. ``ft_ddp`` starts one
(this module, as a child process) for a local run when no address is given; on a cluster run it
once, somewhere every group can reach, and give its address to every group
(``lighthouse="http://host:29510"`` or ``TORCHFT_LIGHTHOUSE``). torchft's own ``torchft_lighthouse``
command does the same; this one prints the bound address on its first line, so a port of 0
(the OS picks a free one) can be used without a race.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT, or until stdin closes when ``--exit-with-stdin`` is given."""
    parser = argparse.ArgumentParser(prog="python -m phalanx_strategy_torchft.lighthouse")
    parser.add_argument("--bind", default="[::]:29510", help="host:port to listen on (port 0: any free port)")
    parser.add_argument("--min-replicas", type=int, default=1, help="replica groups a quorum needs")
    parser.add_argument("--join-timeout-ms", type=int, default=60000, help="wait this long for stragglers")
    parser.add_argument("--heartbeat-timeout-ms", type=int, default=5000, help="a group silent this long is dead")
    parser.add_argument("--quorum-tick-ms", type=int, default=100)
    parser.add_argument("--exit-with-stdin", action="store_true", help="stop when stdin closes (parent died)")
    args = parser.parse_args(argv)

    from torchft._torchft import LighthouseServer

    server = LighthouseServer(
        bind=args.bind,
        min_replicas=args.min_replicas,
        join_timeout_ms=args.join_timeout_ms,
        quorum_tick_ms=args.quorum_tick_ms,
        heartbeat_timeout_ms=args.heartbeat_timeout_ms,
    )
    address = server.address()
    host = args.bind.rsplit(":", 1)[0]
    if host not in ("[::]", "0.0.0.0", ""):  # bound to one interface: advertise that one, not the hostname
        address = f"http://{host}:{address.rsplit(':', 1)[1]}"
    print(address, flush=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if args.exit_with_stdin:

        def watch_stdin() -> None:
            sys.stdin.read()
            stop.set()

        threading.Thread(target=watch_stdin, daemon=True).start()
    stop.wait()
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
