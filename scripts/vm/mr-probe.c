/*
 * mr-probe DEV BYTES: registers one BYTES-sized memory region on RDMA device DEV and reports whether
 * ibv_reg_mr succeeded. Used by check.sh (inside the VM) to see whether the memlock limit allows large
 * registrations. Built on the host by check.sh: cc -O2 -o mr-probe mr-probe.c -libverbs
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct ibv_context *open_device(const char *name)
{
    int count = 0;
    struct ibv_device **list = ibv_get_device_list(&count);
    struct ibv_context *ctx = NULL;

    for (int i = 0; list && i < count; i++)
        if (strcmp(ibv_get_device_name(list[i]), name) == 0)
            ctx = ibv_open_device(list[i]);
    if (list)
        ibv_free_device_list(list);
    return ctx;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s DEV BYTES\n", argv[0]);
        return 2;
    }
    size_t bytes = strtoull(argv[2], NULL, 0);
    struct ibv_context *ctx = open_device(argv[1]);
    if (!ctx) {
        printf("FAILED: cannot open device %s\n", argv[1]);
        return 1;
    }
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    void *buf = NULL;
    if (!pd || posix_memalign(&buf, 4096, bytes) != 0) {
        printf("FAILED: ibv_alloc_pd or allocation\n");
        return 1;
    }
    memset(buf, 0xa5, bytes);
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, bytes, access);
    if (!mr) {
        int err = errno;
        printf("FAILED: ibv_reg_mr of %zu bytes on %s: %s (errno %d)\n", bytes, argv[1], strerror(err), err);
        return 1;
    }
    printf("ok: registered %zu bytes on %s (lkey 0x%x)\n", bytes, argv[1], mr->lkey);
    ibv_dereg_mr(mr);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    free(buf);
    return 0;
}
