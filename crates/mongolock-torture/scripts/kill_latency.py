#!/usr/bin/env python3
"""How long a SIGKILLed process takes to die while other work keeps the CPUs busy.

`mongolock exec` SIGKILLs a command (and what it started) a margin before the lease's local
deadline, so that it is dead, not merely signalled, by then. A killed process is dead only once
the scheduler has run its exit. This measures that time for a shell loop in a session of its own
(as a `setsid` descendant of a command is), with busy loops in another session whose autogroup
nice value is the argument (0: equal CPU shares per session; -20: the busy session gets ~87
times the victim's share).

    python3 crates/mongolock-torture/scripts/kill_latency.py 0
    python3 crates/mongolock-torture/scripts/kill_latency.py -20   # as root

Linux only (autogroups, /proc).
"""
import os
import signal
import subprocess
import sys
import time

NICE = sys.argv[1] if len(sys.argv) > 1 else "0"
TRIALS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
BUSY = os.cpu_count() or 2


def state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


busy = subprocess.Popen(
    ["sh", "-c", f"echo {NICE} > /proc/self/autogroup; "
     f"for i in $(seq {BUSY + 1}); do (while :; do :; done) & done; wait"],
    start_new_session=True,
)
time.sleep(1)
with open(f"/proc/{busy.pid}/autogroup") as f:
    print("busy session:", f.read().strip(), f"({BUSY + 1} loops)")
latencies = []
try:
    for _ in range(TRIALS):
        victim = subprocess.Popen(
            ["sh", "-c", "while :; do touch /dev/null; sleep 0.1; done"],
            start_new_session=True,
        )
        time.sleep(0.5)
        t0 = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        while state(victim.pid) not in ("Z", "X", "gone"):
            time.sleep(0.0005)
        latencies.append((time.monotonic() - t0) * 1000)
        victim.wait()
finally:
    os.killpg(busy.pid, signal.SIGKILL)
print("SIGKILL to exit (ms):", " ".join(f"{x:.1f}" for x in latencies),
      f"| max {max(latencies):.1f}")
