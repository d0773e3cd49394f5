/*
 * cuda_graph.c: CUDA graphs through the driver API (issue 19 item 3), for
 * the executor's decode step (runtime/executor/forward_graph.c): stream
 * capture, instantiation, the in-place update of an executable graph,
 * launch and release.
 *
 * The entry points are optional: cuda.c's driver stays usable without
 * them, and they are looked up on first use through cuGetProcAddress at
 * version 12000, the form these typedefs follow. cuGraphExecUpdate changed
 * its signature in 12.0 (a result-info struct instead of an error node and
 * a result code), so a driver older than 12.0 has no graphs here rather
 * than the wrong call: khub__cuda_graphs_check says so, and the executor
 * runs plain stream launches.
 *
 * Capture runs in relaxed mode: a plugin's first call on a stream may load
 * its module or allocate, which the global and thread-local modes forbid
 * during a capture. What still breaks a capture (a synchronisation of the
 * stream, work on the legacy default stream) makes the driver invalidate it
 * and khub__cuda_capture_end fail with the driver's error.
 */
#include <pthread.h>
#include <stdio.h>

#include "cuda.h"
#include "runtime_impl.h"

#define GRAPH_API_VERSION                    12000
#define CU_STREAM_CAPTURE_MODE_RELAXED       2
#define CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE 910

/* CUgraphExecUpdateResultInfo (CUDA 12.0). */
typedef struct update_info {
    int result; /* CUgraphExecUpdateResult: 0 = success */
    void *error_node;
    void *error_from_node;
} update_info;

static struct {
    pthread_once_t once;
    bool ok;
    char why[160];
    int (*begin)(void *stream, int mode);
    int (*end)(void *stream, void **graph);
    int (*instantiate)(void **exec, void *graph, unsigned long long flags);
    int (*update)(void *exec, void *graph, update_info *info);
    int (*launch)(void *exec, void *stream);
    int (*graph_destroy)(void *graph);
    int (*exec_destroy)(void *exec);
} api = {.once = PTHREAD_ONCE_INIT};

static void resolve(void)
{
    int v = khub__cuda_driver_version();
    if (v <= 0) {
        snprintf(api.why, sizeof api.why, "no usable CUDA driver");
        return;
    }
    if (v < GRAPH_API_VERSION) {
        snprintf(api.why, sizeof api.why,
                 "CUDA driver %d.%d is older than 12.0, whose cuGraphExecUpdate khub calls",
                 v / 1000, v % 1000 / 10);
        return;
    }
    const struct {
        const char *name;
        void **slot;
    } want[] = {
        {"cuStreamBeginCapture", (void **)&api.begin},
        {"cuStreamEndCapture", (void **)&api.end},
        {"cuGraphInstantiateWithFlags", (void **)&api.instantiate},
        {"cuGraphExecUpdate", (void **)&api.update},
        {"cuGraphLaunch", (void **)&api.launch},
        {"cuGraphDestroy", (void **)&api.graph_destroy},
        {"cuGraphExecDestroy", (void **)&api.exec_destroy},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!khub__cuda_proc(want[i].name, want[i].slot, GRAPH_API_VERSION)) {
            snprintf(api.why, sizeof api.why, "CUDA driver %d.%d lacks %s", v / 1000, v % 1000 / 10,
                     want[i].name);
            return;
        }
    api.ok = true;
}

khub_status khub__cuda_graphs_check(void)
{
    pthread_once(&api.once, resolve);
    if (!api.ok) return khub__plugin_fail(KHUB_STATUS_UNSUPPORTED, "%s", api.why);
    return khub__cuda_use_current();
}

khub_status khub__cuda_capture_begin(void *stream)
{
    KHUB_FORWARD_IF_ERROR(NULL, khub__cuda_graphs_check());
    return khub__cuda_check(api.begin(stream, CU_STREAM_CAPTURE_MODE_RELAXED),
                            "cuStreamBeginCapture");
}

khub_status khub__cuda_capture_end(void *stream, void **graph)
{
    *graph = NULL;
    KHUB_FORWARD_IF_ERROR(NULL, khub__cuda_graphs_check());
    void *g = NULL;
    khub_status st = khub__cuda_check(api.end(stream, &g), "cuStreamEndCapture");
    if (st != KHUB_STATUS_OK) {
        if (g) api.graph_destroy(g); /* a driver that returns one anyway */
        return st;
    }
    *graph = g;
    return KHUB_STATUS_OK;
}

khub_status khub__cuda_graph_instantiate(void *graph, void **exec)
{
    *exec = NULL;
    KHUB_FORWARD_IF_ERROR(NULL, khub__cuda_graphs_check());
    void *e = NULL;
    KHUB_FORWARD_IF_ERROR(
        NULL, khub__cuda_check(api.instantiate(&e, graph, 0), "cuGraphInstantiateWithFlags"));
    *exec = e;
    return KHUB_STATUS_OK;
}

khub_status khub__cuda_graph_update(void *exec, void *graph, bool *reshaped)
{
    *reshaped = false;
    KHUB_FORWARD_IF_ERROR(NULL, khub__cuda_graphs_check());
    update_info info = {0, NULL, NULL};
    int r = api.update(exec, graph, &info);
    /* The graphs differ in more than parameters (nodes, their kinds, a
     * kernel's function): the executable is left as it was; make another. */
    *reshaped = r == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    khub_status st = khub__cuda_check(r, "cuGraphExecUpdate");
    if (st == KHUB_STATUS_OK || !*reshaped) return st;
    char msg[256];
    snprintf(msg, sizeof msg, "%s", khub__plugin_msg());
    return khub__plugin_fail(st, "%s (update result %d)", msg, info.result);
}

khub_status khub__cuda_graph_launch(void *exec, void *stream)
{
    KHUB_FORWARD_IF_ERROR(NULL, khub__cuda_graphs_check());
    return khub__cuda_check(api.launch(exec, stream), "cuGraphLaunch");
}

void khub__cuda_graph_free(void *graph)
{
    if (graph && khub__cuda_graphs_check() == KHUB_STATUS_OK) api.graph_destroy(graph);
}

void khub__cuda_graph_exec_free(void *exec)
{
    if (exec && khub__cuda_graphs_check() == KHUB_STATUS_OK) api.exec_destroy(exec);
}
