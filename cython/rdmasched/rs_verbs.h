/* rs_verbs.h: accessors for the anonymous unions of libibverbs' structs, which Cython cannot
 * name. Nothing else: the data path itself is in _verbs.pyx.
 */
#ifndef RS_VERBS_H
#define RS_VERBS_H

#include <stdint.h>
#include <string.h>
#include <endian.h>
#include <infiniband/verbs.h>

static inline void rs_wr_set_rdma(struct ibv_send_wr *wr, uint64_t remote_addr, uint32_t rkey)
{
    wr->wr.rdma.remote_addr = remote_addr;
    wr->wr.rdma.rkey = rkey;
}

static inline uint64_t rs_wr_remote_addr(const struct ibv_send_wr *wr)
{
    return wr->wr.rdma.remote_addr;
}

static inline uint32_t rs_wr_rkey(const struct ibv_send_wr *wr)
{
    return wr->wr.rdma.rkey;
}

static inline void rs_wr_set_imm(struct ibv_send_wr *wr, uint32_t imm)
{
    wr->imm_data = htobe32(imm);
}

static inline void rs_ah_set_dgid(struct ibv_ah_attr *ah, const uint8_t *gid)
{
    memcpy(ah->grh.dgid.raw, gid, 16);
}

#endif
