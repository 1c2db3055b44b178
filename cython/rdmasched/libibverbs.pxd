# libibverbs.pxd: every libibverbs declaration the verbs transport uses, in one place (as
# pyverbs keeps its own libibverbs.pxd). Only the fields and constants rdmasched touches are
# declared; Cython takes the real layouts from <infiniband/verbs.h>. Nothing here is compiled
# into a module of its own: `cimport` it (`from rdmasched.libibverbs cimport ...`).
#
# The anonymous unions of ibv_send_wr and ibv_ah_attr cannot be named from Cython: the few
# accessors the data path needs are the static inline functions of rs_verbs.h, at the end.

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t

cdef extern from "<infiniband/verbs.h>" nogil:
    struct ibv_context:
        pass
    struct ibv_pd:
        pass
    struct ibv_comp_channel:
        int fd
    struct ibv_srq:
        pass
    struct ibv_cq:
        pass

    enum ibv_qp_state:
        IBV_QPS_RESET
        IBV_QPS_INIT
        IBV_QPS_RTR
        IBV_QPS_RTS
        IBV_QPS_SQD
        IBV_QPS_SQE
        IBV_QPS_ERR
        IBV_QPS_UNKNOWN
    enum ibv_qp_type:
        IBV_QPT_RC
    enum ibv_mtu:
        IBV_MTU_256
        IBV_MTU_4096
    enum ibv_wr_opcode:
        IBV_WR_RDMA_WRITE
        IBV_WR_RDMA_WRITE_WITH_IMM
        IBV_WR_RDMA_READ
    enum:
        IBV_SEND_SIGNALED
        IBV_SEND_INLINE
    enum ibv_wc_status:
        IBV_WC_SUCCESS
        IBV_WC_WR_FLUSH_ERR
    enum:
        IBV_ACCESS_LOCAL_WRITE
        IBV_ACCESS_REMOTE_WRITE
        IBV_ACCESS_REMOTE_READ
    enum:
        IBV_QP_STATE
        IBV_QP_ACCESS_FLAGS
        IBV_QP_PKEY_INDEX
        IBV_QP_PORT
        IBV_QP_AV
        IBV_QP_PATH_MTU
        IBV_QP_TIMEOUT
        IBV_QP_RETRY_CNT
        IBV_QP_RNR_RETRY
        IBV_QP_RQ_PSN
        IBV_QP_MAX_QP_RD_ATOMIC
        IBV_QP_MIN_RNR_TIMER
        IBV_QP_SQ_PSN
        IBV_QP_MAX_DEST_RD_ATOMIC
        IBV_QP_DEST_QPN

    struct ibv_qp:
        uint32_t qp_num
        ibv_qp_state state

    struct ibv_sge:
        uint64_t addr
        uint32_t length
        uint32_t lkey

    struct ibv_send_wr:
        uint64_t wr_id
        ibv_send_wr *next
        ibv_sge *sg_list
        int num_sge
        ibv_wr_opcode opcode
        unsigned int send_flags

    struct ibv_wc:
        uint64_t wr_id
        ibv_wc_status status
        uint32_t vendor_err
        uint32_t qp_num

    struct ibv_qp_cap:
        uint32_t max_send_wr
        uint32_t max_recv_wr
        uint32_t max_send_sge
        uint32_t max_recv_sge
        uint32_t max_inline_data

    struct ibv_qp_init_attr:
        void *qp_context
        ibv_cq *send_cq
        ibv_cq *recv_cq
        ibv_srq *srq
        ibv_qp_cap cap
        ibv_qp_type qp_type
        int sq_sig_all

    struct ibv_global_route:
        uint32_t flow_label
        uint8_t sgid_index
        uint8_t hop_limit
        uint8_t traffic_class

    struct ibv_ah_attr:
        ibv_global_route grh
        uint16_t dlid
        uint8_t sl
        uint8_t src_path_bits
        uint8_t static_rate
        uint8_t is_global
        uint8_t port_num

    struct ibv_qp_attr:
        ibv_qp_state qp_state
        ibv_mtu path_mtu
        uint32_t rq_psn
        uint32_t sq_psn
        uint32_t dest_qp_num
        unsigned int qp_access_flags
        ibv_qp_cap cap
        ibv_ah_attr ah_attr
        uint16_t pkey_index
        uint8_t max_rd_atomic
        uint8_t max_dest_rd_atomic
        uint8_t min_rnr_timer
        uint8_t port_num
        uint8_t timeout
        uint8_t retry_cnt
        uint8_t rnr_retry

    struct ibv_device:
        pass
    struct ibv_mr:
        void *addr
        size_t length
        uint32_t lkey
        uint32_t rkey

    struct ibv_recv_wr:
        uint64_t wr_id
        ibv_recv_wr *next
        ibv_sge *sg_list
        int num_sge

    ibv_comp_channel *ibv_create_comp_channel(ibv_context *context)
    int ibv_destroy_comp_channel(ibv_comp_channel *channel)
    int ibv_req_notify_cq(ibv_cq *cq, int solicited_only)
    int ibv_get_cq_event(ibv_comp_channel *channel, ibv_cq **cq, void **cq_context)
    void ibv_ack_cq_events(ibv_cq *cq, unsigned int nevents)
    int ibv_post_recv(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad_wr)
    ibv_device **ibv_get_device_list(int *num_devices)
    void ibv_free_device_list(ibv_device **list)
    const char *ibv_get_device_name(ibv_device *device)
    ibv_context *ibv_open_device(ibv_device *device)
    int ibv_close_device(ibv_context *context)
    ibv_pd *ibv_alloc_pd(ibv_context *context)
    int ibv_dealloc_pd(ibv_pd *pd)
    ibv_mr *ibv_reg_mr(ibv_pd *pd, void *addr, size_t length, int access)
    int ibv_dereg_mr(ibv_mr *mr)
    ibv_cq *ibv_create_cq(ibv_context *context, int cqe, void *cq_context,
                          ibv_comp_channel *channel, int comp_vector)
    int ibv_destroy_cq(ibv_cq *cq)
    ibv_qp *ibv_create_qp(ibv_pd *pd, ibv_qp_init_attr *qp_init_attr)
    int ibv_destroy_qp(ibv_qp *qp)
    int ibv_modify_qp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask)
    int ibv_query_qp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask, ibv_qp_init_attr *init_attr)
    int ibv_post_send(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad_wr)
    int ibv_poll_cq(ibv_cq *cq, int num_entries, ibv_wc *wc)
    const char *ibv_wc_status_str(ibv_wc_status status)


cdef extern from "rs_verbs.h" nogil:
    void rs_wr_set_rdma(ibv_send_wr *wr, uint64_t remote_addr, uint32_t rkey)
    uint64_t rs_wr_remote_addr(const ibv_send_wr *wr)
    uint32_t rs_wr_rkey(const ibv_send_wr *wr)
    void rs_wr_set_imm(ibv_send_wr *wr, uint32_t imm)
    void rs_ah_set_dgid(ibv_ah_attr *ah, const uint8_t *gid)
