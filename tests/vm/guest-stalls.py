"""Guest: how long this VM's vCPU was not run (tests/vm/guest-init.sh runs it beside COMMAND).

Usage (inside a guest): python3 guest-stalls.py OUTFILE

Sleeps 100 ms at a time on CLOCK_MONOTONIC, which under qemu's TCG follows the host's clock:
a wake-up later than that by more than a second is a time the guest did not run (its qemu
descheduled on a busy host), whatever COMMAND was doing. Rewrites OUTFILE ("key value"
lines: max_stall_ms, stalls_over_1s, then one "stall <uptime_s> <ms>" line each) whenever
such a stall ends; run-in-vm.sh reads it after COMMAND.
"""

import os
import sys
import time

PERIOD_S = 0.1
REPORT_S = 1.0


def main() -> int:
    out = sys.argv[1]
    stalls: list[tuple[float, float]] = []
    prev = time.monotonic()
    while True:
        time.sleep(PERIOD_S)
        now = time.monotonic()
        late = now - prev - PERIOD_S
        prev = now
        if late > REPORT_S:
            with open("/proc/uptime") as f:
                up = float(f.read().split()[0])
            stalls.append((up - late, late * 1000))
            worst = max(ms for _, ms in stalls)
            lines = [f"max_stall_ms {worst:.0f}", f"stalls_over_1s {len(stalls)}"]
            lines += [f"stall {at:.1f} {ms:.0f}" for at, ms in stalls]
            with open(out + ".tmp", "w") as f:
                f.write("\n".join(lines) + "\n")
            os.replace(out + ".tmp", out)


if __name__ == "__main__":
    sys.exit(main())
