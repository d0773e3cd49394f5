/* fake_graph.c: CUDA graphs in the stand-in libcuda.so.1 (fake_cuda.c),
 * behaving like a real driver where khub's host side can tell:
 *   - cuStreamBeginCapture puts a stream in capture mode; its launches and
 *     copies are then recorded (kernel parameters copied by value, as a
 *     driver copies them), not run, until cuStreamEndCapture hands the
 *     recorded graph over.
 *   - A capture breaks the way a real one does: synchronising the
 *     capturing stream fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
 *     and work on the legacy default stream (or its synchronisation) while
 *     a stream captures fails with CUDA_ERROR_STREAM_CAPTURE_IMPLICIT; both
 *     invalidate the capture, after which the stream's operations fail
 *     with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and so does its end
 *     (no graph). An allocation during a capture of mode global or
 *     thread-local fails with ..._UNSUPPORTED and invalidates it; relaxed
 *     mode allows it.
 *   - cuGraphInstantiateWithFlags copies a graph into an executable one;
 *     cuGraphExecUpdate takes the new graph's parameters (kernel
 *     parameters and dimensions, copy addresses) when the two have the same
 *     nodes of the same kinds and functions, else fails with
 *     CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE and the result code saying what
 *     differs (topology, node type, function), leaving the executable as
 *     it was; cuGraphLaunch runs the nodes in order: kernels are logged
 *     (and run their host bodies) as plain launches are, copies copy.
 *   - Handles are checked (CUDA_ERROR_INVALID_HANDLE for one not live).
 * Counters for khub_fake_cuda_stat: graph_captures (ended with a graph),
 * graph_captures_invalidated, graphs_live, graph_execs_live,
 * graph_instantiations, graph_updates (in place), graph_update_failures,
 * graph_launches, graph_nodes_recorded. Everything runs under fake_lock.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda.h"

struct fake_graph {
    struct fake_graph *next; /* live graphs */
    int n, cap;
    fake_node *nodes;
};

typedef struct fake_exec {
    struct fake_exec *next; /* live executable graphs */
    int n;
    fake_node *nodes;
} fake_exec;

static fake_graph *graphs;
static fake_exec *execs;
static long st_captures, st_invalidated, st_graphs_live, st_execs_live, st_instantiations,
    st_updates, st_update_failures, st_graph_launches, st_nodes;

long fake_graph_stat(const char *what, int *found)
{
    const struct {
        const char *name;
        long value;
    } t[] = {
        {"graph_captures", st_captures},
        {"graph_captures_invalidated", st_invalidated},
        {"graphs_live", st_graphs_live},
        {"graph_execs_live", st_execs_live},
        {"graph_instantiations", st_instantiations},
        {"graph_updates", st_updates},
        {"graph_update_failures", st_update_failures},
        {"graph_launches", st_graph_launches},
        {"graph_nodes_recorded", st_nodes},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (strcmp(what, t[i].name) == 0) {
            *found = 1;
            return t[i].value;
        }
    *found = 0;
    return -1;
}

static void graph_free(fake_graph *g)
{
    if (!g) return;
    free(g->nodes);
    free(g);
}

static int any_capturing(void)
{
    for (fake_stream *s = fake_streams; s; s = s->next)
        if (s->capture) return 1;
    return 0;
}

static void invalidate(fake_stream *s)
{
    if (s->capture && !s->invalidated) st_invalidated++;
    s->invalidated = 1;
}

static void invalidate_all(void)
{
    for (fake_stream *s = fake_streams; s; s = s->next)
        if (s->capture) invalidate(s);
}

/* ======================================================================== */
/* What capture does to the other calls                                     */
/* ======================================================================== */

int fake_capture_gate(void *stream, const fake_node *op)
{
    if (!stream) {
        if (!any_capturing()) return 0;
        invalidate_all(); /* the legacy stream would wait for a capturing one */
        return CU_CAPTURE_IMPLICIT;
    }
    fake_stream *s = fake_find_stream(stream);
    if (!s || !s->capture) return 0;
    if (s->invalidated) return CU_CAPTURE_INVALIDATED;
    fake_graph *g = s->capture;
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        fake_node *n = realloc(g->nodes, (size_t)cap * sizeof *n);
        if (!n) {
            invalidate(s);
            return CU_OUT_OF_MEMORY;
        }
        g->nodes = n, g->cap = cap;
    }
    g->nodes[g->n++] = *op;
    st_nodes++;
    return FAKE_RECORDED;
}

int fake_capture_sync(void *stream)
{
    if (!stream) {
        if (!any_capturing()) return 0;
        invalidate_all();
        return CU_CAPTURE_IMPLICIT;
    }
    fake_stream *s = fake_find_stream(stream);
    if (!s || !s->capture) return 0;
    invalidate(s);
    return CU_CAPTURE_UNSUPPORTED;
}

int fake_capture_alloc(void)
{
    int r = 0;
    for (fake_stream *s = fake_streams; s; s = s->next)
        if (s->capture && s->capture_mode != 2) {
            invalidate(s);
            r = CU_CAPTURE_UNSUPPORTED;
        }
    return r;
}

void fake_capture_drop(fake_stream *s)
{
    graph_free(s->capture);
    s->capture = NULL;
    s->invalidated = 0;
}

/* ======================================================================== */
/* Capture                                                                  */
/* ======================================================================== */

/* CUresult cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode) */
EXPORT int cuStreamBeginCapture_v2(void *stream, int mode)
{
    pthread_mutex_lock(&fake_lock);
    fake_stream *s = stream ? fake_find_stream(stream) : NULL;
    int r = CU_OK;
    if (fake_fails("cuStreamBeginCapture") || mode < 0 || mode > 2)
        r = CU_INVALID_VALUE;
    else if (!stream)
        r = CU_CAPTURE_UNSUPPORTED; /* the legacy stream cannot be captured */
    else if (!s)
        r = CU_INVALID_HANDLE;
    else if (s->capture)
        r = CU_ILLEGAL_STATE;
    else if (!(s->capture = calloc(1, sizeof *s->capture)))
        r = CU_OUT_OF_MEMORY;
    if (!r) s->capture_mode = mode, s->invalidated = 0;
    pthread_mutex_unlock(&fake_lock);
    return r;
}

EXPORT int cuStreamEndCapture(void *stream, void **graph)
{
    pthread_mutex_lock(&fake_lock);
    *graph = NULL;
    fake_stream *s = stream ? fake_find_stream(stream) : NULL;
    int r = CU_OK;
    if (!s)
        r = stream ? CU_INVALID_HANDLE : CU_ILLEGAL_STATE;
    else if (!s->capture)
        r = CU_ILLEGAL_STATE;
    else if (fake_fails("cuStreamEndCapture") || s->invalidated) {
        if (!s->invalidated) st_invalidated++;
        fake_capture_drop(s);
        r = CU_CAPTURE_INVALIDATED;
    } else {
        fake_graph *g = s->capture;
        s->capture = NULL;
        g->next = graphs;
        graphs = g;
        st_graphs_live++;
        st_captures++;
        *graph = g;
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* 0 CU_STREAM_CAPTURE_STATUS_NONE, 1 _ACTIVE, 2 _INVALIDATED. */
EXPORT int cuStreamIsCapturing(void *stream, int *status)
{
    pthread_mutex_lock(&fake_lock);
    fake_stream *s = stream ? fake_find_stream(stream) : NULL;
    int r = stream && !s ? CU_INVALID_HANDLE : CU_OK;
    if (!r) *status = !s || !s->capture ? 0 : s->invalidated ? 2 : 1;
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* ======================================================================== */
/* Graphs and executable graphs                                             */
/* ======================================================================== */

static fake_graph *live_graph(void *h)
{
    fake_graph *g = graphs;
    while (g && g != h) g = g->next;
    return g;
}

static fake_exec *live_exec(void *h)
{
    fake_exec *e = execs;
    while (e && e != h) e = e->next;
    return e;
}

EXPORT int cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags)
{
    (void)flags;
    pthread_mutex_lock(&fake_lock);
    *exec = NULL;
    fake_graph *g = live_graph(graph);
    fake_exec *e = NULL;
    int r = !g                                          ? CU_INVALID_HANDLE
            : fake_fails("cuGraphInstantiateWithFlags") ? CU_OUT_OF_MEMORY
                                                        : CU_OK;
    if (!r && (!(e = calloc(1, sizeof *e)) ||
               (g->n && !(e->nodes = malloc((size_t)g->n * sizeof *e->nodes))))) {
        free(e);
        r = CU_OUT_OF_MEMORY;
    }
    if (!r) {
        if (g->n) memcpy(e->nodes, g->nodes, (size_t)g->n * sizeof *e->nodes);
        e->n = g->n;
        e->next = execs;
        execs = e;
        st_execs_live++;
        st_instantiations++;
        *exec = e;
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* CUgraphExecUpdateResultInfo: result, errorNode, errorFromNode. */
typedef struct update_info {
    int result;
    void *error_node;
    void *error_from_node;
} update_info;

enum { UPD_SUCCESS = 0, UPD_ERROR = 1, UPD_TOPOLOGY = 2, UPD_NODE_TYPE = 3, UPD_FUNCTION = 4 };

static int differs(const fake_exec *e, const fake_graph *g)
{
    if (e->n != g->n) return UPD_TOPOLOGY;
    for (int i = 0; i < e->n; i++) {
        if (e->nodes[i].kind != g->nodes[i].kind) return UPD_NODE_TYPE;
        if (e->nodes[i].kind == NODE_KERNEL && e->nodes[i].fn != g->nodes[i].fn)
            return UPD_FUNCTION;
    }
    return UPD_SUCCESS;
}

/* CUresult cuGraphExecUpdate_v2(CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo *) */
EXPORT int cuGraphExecUpdate_v2(void *exec, void *graph, void *result_info)
{
    update_info *info = result_info;
    pthread_mutex_lock(&fake_lock);
    fake_exec *e = live_exec(exec);
    fake_graph *g = live_graph(graph);
    int r = CU_OK;
    if (!e || !g || !info) {
        r = !info ? CU_INVALID_VALUE : CU_INVALID_HANDLE;
    } else {
        memset(info, 0, sizeof *info);
        info->result = fake_fails("cuGraphExecUpdate") ? UPD_ERROR : differs(e, g);
        if (info->result != UPD_SUCCESS) {
            st_update_failures++;
            r = CU_GRAPH_UPDATE_FAILURE;
        } else {
            /* Same nodes: only their parameters move over. */
            if (g->n) memcpy(e->nodes, g->nodes, (size_t)g->n * sizeof *e->nodes);
            st_updates++;
        }
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

EXPORT int cuGraphLaunch(void *exec, void *stream)
{
    pthread_mutex_lock(&fake_lock);
    fake_exec *e = live_exec(exec);
    fake_stream *s = stream ? fake_find_stream(stream) : NULL;
    int r = CU_OK;
    if (!e || (stream && !s))
        r = CU_INVALID_HANDLE;
    else if (fake_fails("cuGraphLaunch"))
        r = CU_LAUNCH_FAILED;
    else if ((s && s->capture) || (!stream && any_capturing()))
        r = CU_CAPTURE_UNSUPPORTED; /* a graph inside a capture: not in this fake */
    for (int i = 0; !r && i < e->n; i++) {
        if (e->nodes[i].kind == NODE_KERNEL)
            fake_run_kernel(&e->nodes[i], s);
        else
            r = fake_run_copy(&e->nodes[i]);
    }
    if (!r) st_graph_launches++;
    pthread_mutex_unlock(&fake_lock);
    return r;
}

EXPORT int cuGraphDestroy(void *graph)
{
    pthread_mutex_lock(&fake_lock);
    fake_graph **at = &graphs;
    while (*at && *at != graph) at = &(*at)->next;
    fake_graph *g = *at;
    if (g) {
        *at = g->next;
        graph_free(g);
        st_graphs_live--;
    }
    pthread_mutex_unlock(&fake_lock);
    return g ? CU_OK : CU_INVALID_HANDLE;
}

EXPORT int cuGraphExecDestroy(void *exec)
{
    pthread_mutex_lock(&fake_lock);
    fake_exec **at = &execs;
    while (*at && *at != exec) at = &(*at)->next;
    fake_exec *e = *at;
    if (e) {
        *at = e->next;
        free(e->nodes);
        free(e);
        st_execs_live--;
    }
    pthread_mutex_unlock(&fake_lock);
    return e ? CU_OK : CU_INVALID_HANDLE;
}
