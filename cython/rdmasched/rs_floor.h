/* rs_floor.h: this machine's floor for a same-host one-sided ping-pong, in plain C.
 *
 * Two 8-byte flags, each on its own 64-byte line of a shared mapping: the pinger stores i into
 * `ping` and spins (with pause) until `pong` reads i; the echo side spins on `ping` and stores
 * it into `pong`. No checksum, no ring, no Python: the cost of moving two cache lines between
 * the cores and noticing them. rdmasched's lanes are measured against it.
 */
#ifndef RS_FLOOR_H
#define RS_FLOOR_H

#include "rs_arch.h"

/* Returns 0, or -1 if the peer did not answer within timeout_ns. `samples` (pinger only)
 * receives one round trip in ns per iteration. */
static inline int rs_floor_run(volatile uint64_t *ping, volatile uint64_t *pong, int pinger,
                               uint64_t iters, uint64_t *samples, uint64_t timeout_ns)
{
    uint64_t t_prev = rs_now_ns(), t;
    for (uint64_t i = 1; i <= iters; i++) {
        uint32_t k = 0;
        if (pinger) {
            rs_store_release_u64(ping, i);
            while (rs_load_acquire_u64(pong) != i) {
                rs_pause();
                if ((++k & 0xFFFFF) == 0 && rs_now_ns() - t_prev > timeout_ns)
                    return -1;
            }
            t = rs_now_ns();
            samples[i - 1] = t - t_prev;
            t_prev = t;
        } else {
            while (rs_load_acquire_u64(ping) != i) {
                rs_pause();
                if ((++k & 0xFFFFF) == 0 && rs_now_ns() - t_prev > timeout_ns)
                    return -1;
            }
            rs_store_release_u64(pong, i);
            t_prev = rs_now_ns();
        }
    }
    return 0;
}

#endif
