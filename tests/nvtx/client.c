/* A real NVTX client, built against the real nvtx3 headers (include/), for
 * tests/nvtx.rs. It annotates a fake training loop the ways applications do
 * and prints, as one JSON object, its own account of every range: name,
 * domain, thread, the level NVTX returned, and CLOCK_MONOTONIC read just
 * before the range opened and just after it closed. The shim's records must
 * fall inside those brackets. */
#define _GNU_SOURCE
#include <nvtx3/nvToolsExt.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANGES 64

struct truth {
    const char *name;
    const char *domain;
    long tid;
    int level; /* what push returned; -1 where NVTX returns none */
    uint64_t before, after;
};

static struct truth truths[MAX_RANGES];
static int ntruths;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static long tid(void) { return (long)syscall(SYS_gettid); }

static void keep(const char *name, const char *domain, long t, int level, uint64_t before,
                 uint64_t after) {
    pthread_mutex_lock(&lock);
    if (ntruths < MAX_RANGES) {
        struct truth r = {name, domain, t, level, before, after};
        truths[ntruths++] = r;
    }
    pthread_mutex_unlock(&lock);
}

static void spin(void) {
    uint64_t until = now() + 200000; /* 0.2 ms: ranges of visible length */
    while (now() < until) {
    }
}

static int failed;

static void expect(int got, int want, const char *what) {
    if (got != want) {
        fprintf(stderr, "%s returned %d, expected %d\n", what, got, want);
        failed = 1;
    }
}

/* nvtxRangeStartA/End on a thread of its own. */
static void *loader(void *arg) {
    const char *name = arg;
    uint64_t b = now();
    nvtxRangeId_t id = nvtxRangeStartA(name);
    spin();
    nvtxRangeEnd(id);
    keep(name, "", tid(), -1, b, now());
    return NULL;
}

/* Ends a range another thread started. */
static nvtxRangeId_t handoff_id;
static uint64_t handoff_after;
static void *finisher(void *arg) {
    (void)arg;
    nvtxRangeEnd(handoff_id);
    handoff_after = now();
    return NULL;
}

int main(void) {
    long me = tid();

    for (int step = 0; step < 2; step++) {
        static const char *names[] = {"step 0", "step 1"};
        uint64_t b0 = now();
        expect(nvtxRangePushA(names[step]), 0, "push step");
        uint64_t b1 = now();
        expect(nvtxRangePushA("forward"), 1, "push forward");
        spin();
        expect(nvtxRangePop(), 1, "pop forward");
        uint64_t a1 = now();
        uint64_t b2 = now();
        expect(nvtxRangePushA("backward"), 1, "push backward");
        spin();
        expect(nvtxRangePop(), 1, "pop backward");
        uint64_t a2 = now();
        expect(nvtxRangePop(), 0, "pop step");
        uint64_t a0 = now();
        keep(names[step], "", me, 0, b0, a0);
        keep("forward", "", me, 1, b1, a1);
        keep("backward", "", me, 1, b2, a2);
    }

    /* A domain range named by a registered string, inside a default-domain
     * range: each domain has its own stack, so it is at level 0. */
    nvtxDomainHandle_t domain = nvtxDomainCreateA("gapscope.client");
    nvtxStringHandle_t allreduce = nvtxDomainRegisterStringA(domain, "allreduce");
    uint64_t bo = now();
    expect(nvtxRangePushA("comm"), 0, "push comm");
    nvtxEventAttributes_t attr = {0};
    attr.version = NVTX_VERSION;
    attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attr.colorType = NVTX_COLOR_ARGB;
    attr.color = 0xff76b900;
    attr.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    attr.message.registered = allreduce;
    uint64_t bd = now();
    expect(nvtxDomainRangePushEx(domain, &attr), 0, "domain push");
    spin();
    expect(nvtxDomainRangePop(domain), 0, "domain pop");
    uint64_t ad = now();
    expect(nvtxRangePop(), 0, "pop comm");
    uint64_t ao = now();
    keep("comm", "", me, 0, bo, ao);
    keep("allreduce", "gapscope.client", me, 0, bd, ad);

    /* A wide-character range. */
    uint64_t bw = now();
    expect(nvtxRangePushW(L"décodage ✓"), 0, "push wide");
    expect(nvtxRangePop(), 0, "pop wide");
    keep("décodage ✓", "", me, 0, bw, now());

    /* Start/end ranges on two threads at once, and one that ends on another
     * thread than it started on (it belongs to its starter). */
    pthread_t a, b, c;
    pthread_create(&a, NULL, loader, "load A");
    pthread_create(&b, NULL, loader, "load B");
    uint64_t bh = now();
    handoff_id = nvtxRangeStartA("handoff");
    spin();
    pthread_create(&c, NULL, finisher, NULL);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    pthread_join(c, NULL);
    keep("handoff", "", me, -1, bh, handoff_after);

    uint64_t bm = now();
    nvtxMarkA("checkpoint");
    keep("checkpoint", "", me, -1, bm, now());

    printf("{\"pid\":%d,\"tid\":%ld,\"failed\":%d,\"ranges\":[", (int)getpid(), me, failed);
    for (int i = 0; i < ntruths; i++) {
        struct truth *r = &truths[i];
        printf("%s{\"name\":\"%s\",\"domain\":\"%s\",\"tid\":%ld,\"level\":%d,"
               "\"before\":%llu,\"after\":%llu}",
               i ? "," : "", r->name, r->domain, r->tid, r->level,
               (unsigned long long)r->before, (unsigned long long)r->after);
    }
    printf("]}\n");
    return failed;
}
