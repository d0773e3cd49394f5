/*
 * hostile.c: test plugins that attack the gate rather than break a rule by
 * accident (issue 10, item 4). Exactly one HOSTILE_* macro selects the
 * attack (tests/plugins/CMakeLists.txt builds each):
 *   HOSTILE_FORGE    a constructor writes a passing check verdict to every
 *                    descriptor it inherited, then init fails
 *   HOSTILE_SIGPIPE  a constructor closes every descriptor it inherited
 *                    but the result pipe, then asks there for the verdict
 *                    key, so the parent's answer has no reader
 *   HOSTILE_ALARM    the selftest fails when an alarm is pending, i.e. when
 *                    it can tell that it is being checked
 *   HOSTILE_HANG     init ignores SIGALRM and sleeps for ever
 *   HOSTILE_RUNPATH  carries a RUNPATH (linked with one), otherwise clean;
 *                    its constructor leaves a mark (below)
 *   HOSTILE_ESC_ID   its id holds terminal escape codes (ESC [ 2 J)
 *   HOSTILE_KINDS    its ABI note says norm, it registers an activation op
 * Every constructor creates the file named by $KHUB_HOSTILE_MARK (when set),
 * so a test can tell whether any of the plugin's code ran.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <khub/khub_plugin.h>

#include "tp_args.h"

#if defined(HOSTILE_ESC_ID)
#define HID "khub-test/\033[2Jhostile"
#else
#define HID "khub-test/hostile"
#endif

__attribute__((constructor)) static void hostile_ctor(void)
{
    const char *mark = getenv("KHUB_HOSTILE_MARK");
    if (mark) close(open(mark, O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
#if defined(HOSTILE_FORGE)
    /* The verdict khub check's child would write for a good plugin, to
     * every descriptor past stderr: one of them is the channel to the parent. */
    static const char forged[] = "Pselftest\nR0\tkhub-test/hostile 1.0.0: loaded, 1 ops, selftest "
                                 "passed\nPshutdown\n";
    for (int fd = 3; fd < 1024; fd++)
        if (write(fd, forged, sizeof forged - 1) < 0) continue;
#elif defined(HOSTILE_SIGPIPE)
    for (int fd = 4; fd < 1024; fd++) close(fd);
    static const char ask[] = "Kverdict\n";
    if (write(3, ask, sizeof ask - 1) < 0) return;
#endif
}

static khub_status run(void *state, const void *args)
{
    (void)state;
    tp_stamp_args *a = (tp_stamp_args *)(uintptr_t)args;
    a->out[0] = 7;
    return KHUB_STATUS_OK;
}

static khub_status selftest(void *state, char *errbuf, size_t errbuf_size)
{
    (void)state;
#if defined(HOSTILE_ALARM)
    /* A plugin that behaves only while checked would do the opposite; this
     * one fails, so the test can see whether the check was detectable. */
    unsigned left = alarm(0);
    if (left) {
        snprintf(errbuf, errbuf_size, "detected the check: an alarm was pending (%u s left)", left);
        return KHUB_STATUS_INTERNAL;
    }
#endif
    (void)errbuf, (void)errbuf_size;
    return KHUB_STATUS_OK;
}

static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CPU};

#if defined(HOSTILE_KINDS)
#define OP_KIND KHUB_OP_ACTIVATION
#else
#define OP_KIND KHUB_OP_NORM
#endif
static const khub_op_desc ops[] = {{KHUB_STRUCT_INIT(khub_op_desc), .name = "hostile",
                                    .kind = OP_KIND, .caps = &caps, .run = run}};

static khub_status init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                        size_t errbuf_size)
{
    (void)host;
#if defined(HOSTILE_FORGE)
    snprintf(errbuf, errbuf_size, "this plugin never initialises");
    return KHUB_STATUS_IO;
#elif defined(HOSTILE_HANG)
    signal(SIGALRM, SIG_IGN);
    for (;;) pause();
#endif
    (void)errbuf, (void)errbuf_size;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = HID,
                          .version = "1.0.0",
                          .n_ops = 1,
                          .ops = ops,
                          .selftest = selftest};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(init, HID, "1.0.0", KHUB_KIND_BIT(KHUB_OP_NORM))
