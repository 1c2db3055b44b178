/* rs_arch.h: the few machine primitives the Cython hot path needs and Cython cannot spell.
 *
 * Memory ordering, the spin-wait hint, CRC-32C, futex wait/wake on shared memory and a
 * monotonic clock. Everything here is static inline; nothing allocates.
 */
#ifndef RS_ARCH_H
#define RS_ARCH_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <errno.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/futex.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "rdmasched's wire format is little-endian and this build assumes a little-endian host"
#endif

/* ---- ordering ------------------------------------------------------------------------ */
static inline uint64_t rs_load_acquire_u64(const volatile uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline void rs_store_release_u64(volatile uint64_t *p, uint64_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline uint32_t rs_load_acquire_u32(const volatile uint32_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline void rs_store_release_u32(volatile uint32_t *p, uint32_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline int rs_cas_u32(volatile uint32_t *p, uint32_t expect, uint32_t desired)
{
    return __atomic_compare_exchange_n(p, &expect, desired, 0, __ATOMIC_SEQ_CST,
                                       __ATOMIC_SEQ_CST);
}
/* A full (StoreLoad) fence: needed only where a store must be visible before a later load,
 * i.e. the doorbell handshake between a sender and a receiver that goes to sleep. */
static inline void rs_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* ---- spin-wait hint ------------------------------------------------------------------ */
static inline void rs_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

/* ---- clock --------------------------------------------------------------------------- */
static inline uint64_t rs_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- CRC-32C (Castagnoli; reflected poly 0x82F63B78, init and final xor 0xFFFFFFFF) ---- */
static uint32_t rs_crc32c_table[256];
static int rs_crc32c_hw = -1; /* -1: not probed yet */

static inline void rs_crc32c_init(void)
{
    if (rs_crc32c_hw >= 0)
        return;
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        rs_crc32c_table[i] = c;
    }
#if defined(__x86_64__)
    __builtin_cpu_init();
    rs_crc32c_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#else
    rs_crc32c_hw = 0;
#endif
}

/* Raw update (no init/final xor), so callers can chain two spans. */
static inline uint32_t rs_crc32c_sw(uint32_t c, const uint8_t *p, size_t n)
{
    while (n--)
        c = rs_crc32c_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static inline uint32_t
rs_crc32c_hw_update(uint32_t c, const uint8_t *p, size_t n)
{
    uint64_t c64 = c;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c64 = __builtin_ia32_crc32di(c64, w);
        p += 8;
        n -= 8;
    }
    c = (uint32_t)c64;
    if (n >= 4) {
        uint32_t w;
        memcpy(&w, p, 4);
        c = __builtin_ia32_crc32si(c, w);
        p += 4;
        n -= 4;
    }
    while (n--)
        c = __builtin_ia32_crc32qi(c, *p++);
    return c;
}
#endif

static inline uint32_t rs_crc32c_update(uint32_t c, const void *buf, size_t n)
{
#if defined(__x86_64__)
    if (rs_crc32c_hw == 1)
        return rs_crc32c_hw_update(c, (const uint8_t *)buf, n);
#endif
    return rs_crc32c_sw(c, (const uint8_t *)buf, n);
}

static inline uint32_t rs_crc32c(const void *buf, size_t n)
{
    return rs_crc32c_update(0xFFFFFFFFu, buf, n) ^ 0xFFFFFFFFu;
}

/* The slot checksum: CRC-32C over bytes [0, 52) followed by bytes [56, 64) of a 64-byte slot
 * (everything but the checksum field itself, the stamp included). */
static inline uint32_t rs_slot_crc(const void *slot)
{
    const uint8_t *s = (const uint8_t *)slot;
    uint32_t c = rs_crc32c_update(0xFFFFFFFFu, s, 52);
    c = rs_crc32c_update(c, s + 56, 8);
    return c ^ 0xFFFFFFFFu;
}

/* ---- futex on shared memory (no FUTEX_PRIVATE_FLAG: the word is in a MAP_SHARED segment) -- */
/* Returns 0 when woken (or the value already differed), ETIMEDOUT, or EINTR. */
static inline int rs_futex_wait(volatile uint32_t *addr, uint32_t val, uint64_t timeout_ns)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(timeout_ns / 1000000000ull);
    ts.tv_nsec = (long)(timeout_ns % 1000000000ull);
    long r = syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, val, &ts, NULL, 0);
    if (r == 0)
        return 0;
    if (errno == EAGAIN)
        return 0;
    return errno;
}

static inline int rs_futex_wake(volatile uint32_t *addr, int n)
{
    return (int)syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, n, NULL, NULL, 0);
}

#endif /* RS_ARCH_H */
