// What a round trip's code and data footprint costs under TCG, with soft-RoCE underneath.
//
// One thread, two RC QPs of one device connected to each other (no rdma_cm), 32 B inline SENDs
// bounced between them, busy-polled. Between a receive and the answer each side either touches
// N random pages of a 64 MiB array (`pages`) or calls N distinct small functions (`code`). For
// each N it prints the round trip, the same touching or calling alone, and the difference: the
// cost of the verbs path itself (provider and kernel) next to that footprint.
//
// Built and run by footprint.sh (which writes gen.h, the functions).
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "gen.h"

static double now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
#define CK(x) do { if (!(x)) { fprintf(stderr, "failed: %s (line %d)\n", #x, __LINE__); exit(1); } } while (0)

struct ep { struct ibv_cq *cq; struct ibv_qp *qp; };
static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static const int gid_index = 1; // the IPv4-mapped GID
static char *buf;
static struct ibv_mr *mr;
static int sends;

static struct ep make_ep(void) {
    struct ep e;
    e.cq = ibv_create_cq(ctx, 64, 0, 0, 0); CK(e.cq);
    struct ibv_qp_init_attr a = {0};
    a.send_cq = e.cq; a.recv_cq = e.cq; a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = 32; a.cap.max_recv_wr = 32; a.cap.max_send_sge = 1; a.cap.max_recv_sge = 1;
    a.cap.max_inline_data = 64;
    e.qp = ibv_create_qp(pd, &a); CK(e.qp);
    struct ibv_qp_attr m = {0};
    m.qp_state = IBV_QPS_INIT; m.port_num = 1; m.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
    CK(!ibv_modify_qp(e.qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
    return e;
}

static void connect_ep(struct ep *e, uint32_t remote_qpn) {
    struct ibv_qp_attr m = {0};
    m.qp_state = IBV_QPS_RTR; m.path_mtu = IBV_MTU_1024; m.dest_qp_num = remote_qpn;
    m.max_dest_rd_atomic = 1; m.min_rnr_timer = 12;
    m.ah_attr.is_global = 1; m.ah_attr.grh.dgid = gid; m.ah_attr.grh.sgid_index = gid_index;
    m.ah_attr.grh.hop_limit = 1; m.ah_attr.port_num = 1;
    CK(!ibv_modify_qp(e->qp, &m, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN
                                     | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
    memset(&m, 0, sizeof m);
    m.qp_state = IBV_QPS_RTS; m.timeout = 14; m.retry_cnt = 7; m.rnr_retry = 7; m.max_rd_atomic = 1;
    CK(!ibv_modify_qp(e->qp, &m, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN
                                     | IBV_QP_MAX_QP_RD_ATOMIC));
}

static void post_recv(struct ep *e, int slot) {
    struct ibv_sge s = {(uintptr_t)(buf + 4096 * slot), 64, mr->lkey};
    struct ibv_recv_wr w = {0}, *bad;
    w.sg_list = &s; w.num_sge = 1;
    CK(!ibv_post_recv(e->qp, &w, &bad));
}

static void send32(struct ep *e) {
    struct ibv_sge s = {(uintptr_t)(buf + 4096 * 100), 32, mr->lkey};
    struct ibv_send_wr w = {0}, *bad;
    w.sg_list = &s; w.num_sge = 1; w.opcode = IBV_WR_SEND;
    // Inline and unsignaled, one in 32 signaled (as the framework does).
    w.send_flags = IBV_SEND_INLINE | ((++sends % 32) == 0 ? IBV_SEND_SIGNALED : 0);
    CK(!ibv_post_send(e->qp, &w, &bad));
}

static void wait_recv(struct ep *e) {
    struct ibv_wc wc[4];
    for (;;) {
        int n = ibv_poll_cq(e->cq, 4, wc);
        CK(n >= 0);
        for (int i = 0; i < n; i++) {
            CK(wc[i].status == IBV_WC_SUCCESS);
            if (wc[i].opcode == IBV_WC_RECV) return;
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: footprint DEVICE pages|code [ITERS]\n"); return 2; }
    const char *dev = argv[1];
    int code = !strcmp(argv[2], "code");
    long iters = argc > 3 ? atol(argv[3]) : 2000;
    int n;
    struct ibv_device **list = ibv_get_device_list(&n); CK(list);
    for (int i = 0; i < n; i++) if (!strcmp(ibv_get_device_name(list[i]), dev)) ctx = ibv_open_device(list[i]);
    CK(ctx);
    pd = ibv_alloc_pd(ctx); CK(pd);
    CK(!ibv_query_gid(ctx, 1, gid_index, &gid));
    buf = aligned_alloc(4096, 4096 * 128); memset(buf, 0, 4096 * 128);
    mr = ibv_reg_mr(pd, buf, 4096 * 128, IBV_ACCESS_LOCAL_WRITE); CK(mr);
    struct ep a = make_ep(), b = make_ep();
    connect_ep(&a, b.qp->qp_num);
    connect_ep(&b, a.qp->qp_num);
    for (int i = 0; i < 16; i++) { post_recv(&a, i); post_recv(&b, 16 + i); }

    size_t big = (size_t)64 << 20;
    volatile char *mem = malloc(big);
    for (size_t i = 0; i < big; i += 4096) mem[i] = 1;
    size_t *page = malloc(sizeof(size_t) * 4096);
    int *fn = malloc(sizeof(int) * 4096);
    srand(7);
    for (int i = 0; i < 4096; i++) { page[i] = ((size_t)rand() % (big / 4096)) * 4096; fn[i] = (int)(((long)i * 2654435761L) % 4096); }
    volatile long sink = 0;
#define WORK(k0) do { for (int k = 0; k < per_side; k++) { \
        if (code) sink = gfn_table[fn[(k0 + k) % 4096]](sink); else sink += mem[page[(k0 + k) % 4096]]; } } while (0)

    const int sizes[] = {0, 64, 128, 256, 512, 1024};
    for (unsigned r = 0; r < sizeof sizes / sizeof sizes[0]; r++) {
        int per_side = sizes[r];
        double t0 = now_ns();
        for (long i = 0; i < iters; i++) {
            send32(&a); wait_recv(&b); post_recv(&b, 16 + (int)(i % 16)); WORK(0);
            send32(&b); wait_recv(&a); post_recv(&a, (int)(i % 16)); WORK(per_side);
        }
        double rtt = (now_ns() - t0) / iters;
        t0 = now_ns();
        for (long i = 0; i < iters; i++) { WORK(0); WORK(per_side); }
        double alone = (now_ns() - t0) / iters;
        printf("%s %-5s %4d per side: round trip %8.0f ns, the %s alone %8.0f ns, the verbs path %8.0f ns\n",
               dev, code ? "code" : "pages", per_side, rtt, code ? "calls" : "touches", alone, rtt - alone);
    }
    return 0;
}
